"""A checkpoint tree: checkpoints linked by their ``parent`` ids, with
navigation and a text rendering (as ``sandtree tree`` draws it)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Generic, Protocol, TypeVar, overload

from .models import CheckpointInfo

__all__ = ["CheckpointTree", "format_bytes"]


class _HasInfo(Protocol):
    @property
    def info(self) -> CheckpointInfo: ...


C = TypeVar("C", bound=_HasInfo)


class CheckpointTree(Sequence[C], Generic[C]):
    """Checkpoints in the daemon's order (parents before children), as a
    forest built from their ``parent`` links.

    It is a sequence (``len``, indexing, iteration) with lookups by id::

        tree = sb.checkpoints()
        root = tree.roots()[0]
        for child in tree.children(root):
            ...
        print(tree)          # the tree as text
    """

    def __init__(self, checkpoints: Sequence[C]) -> None:
        self._items = list(checkpoints)
        self._by_id = {c.info.id: c for c in self._items}
        self._children: dict[str, list[C]] = {c.info.id: [] for c in self._items}
        for c in self._items:
            parent = c.info.parent
            if parent in self._children and parent != c.info.id:
                self._children[parent].append(c)

    @overload
    def __getitem__(self, index: int) -> C: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[C]: ...

    def __getitem__(self, index: int | slice) -> C | Sequence[C]:
        return self._items[index]

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[C]:
        return iter(self._items)

    def __contains__(self, item: object) -> bool:
        if isinstance(item, str):
            return item in self._by_id
        return item in self._items

    def get(self, checkpoint_id: str) -> C:
        """The checkpoint with that id (``KeyError`` if not in the tree)."""
        return self._by_id[checkpoint_id]

    def roots(self) -> list[C]:
        """Checkpoints whose parent is not in the tree."""
        return [c for c in self._items if c.info.parent not in self._by_id or c.info.parent == c.info.id]

    def children(self, checkpoint: C | str) -> list[C]:
        """The checkpoints taken on top of ``checkpoint`` (or its id)."""
        return list(self._children.get(_id(checkpoint), []))

    def parent(self, checkpoint: C | str) -> C | None:
        """The checkpoint's parent, if it is in the tree."""
        parent = self._by_id[_id(checkpoint)].info.parent
        return self._by_id.get(parent) if parent is not None else None

    def ancestors(self, checkpoint: C | str) -> list[C]:
        """The checkpoint's ancestors in the tree, its parent first."""
        out: list[C] = []
        seen = {_id(checkpoint)}
        current = self.parent(checkpoint)
        while current is not None and current.info.id not in seen:
            out.append(current)
            seen.add(current.info.id)
            current = self.parent(current)
        return out

    def render(self, marks: Mapping[str, Sequence[str]] | None = None) -> str:
        """The forest as text, one checkpoint a line, the way ``git log --graph``
        draws history: a linear run stays in one column and only a branch
        point indents its children::

            ck-aaaa  "base"  captured  1.2 MiB  frozen 3.1 ms
            ck-bbbb  not_captured  4.0 KiB  frozen 2.0 ms
            ├── ck-cccc  ...
            └── ck-dddd  ...  ◀ sb-xxxx

        ``marks`` maps checkpoint ids to what to show after them (e.g. the
        sandboxes that stand on them: ``{sb.base_checkpoint: [sb.id]}``).
        """
        marks = marks or {}
        lines: list[str] = []
        seen: set[str] = set()
        # (first checkpoint of a run, prefix, connector: None at a root, else is-last-child)
        stack: list[tuple[C, str, bool | None]] = [(r, "", None) for r in reversed(self.roots())]
        while stack or len(seen) < len(self._items):
            if not stack:  # parent links that loop: draw from the first left
                stack.append((next(c for c in self._items if c.info.id not in seen), "", None))
            first, prefix, connector = stack.pop()
            run = [first]
            seen.add(first.info.id)
            while True:
                kids = [k for k in self._children[run[-1].info.id] if k.info.id not in seen]
                if len(kids) != 1:
                    break
                seen.add(kids[0].info.id)
                run.append(kids[0])
            cont = prefix if connector is None else prefix + ("    " if connector else "│   ")
            for n, c in enumerate(run):
                lead = cont
                if n == 0:
                    lead = prefix if connector is None else prefix + ("└── " if connector else "├── ")
                lines.append(lead + _line(c.info, marks.get(c.info.id, ())))
            kids = [k for k in self._children[run[-1].info.id] if k.info.id not in seen]
            for n, kid in reversed(list(enumerate(kids))):
                stack.append((kid, cont, n == len(kids) - 1))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render()

    def __repr__(self) -> str:
        return f"CheckpointTree({[c.info.id for c in self._items]!r})"


def _id(checkpoint: _HasInfo | str) -> str:
    return checkpoint if isinstance(checkpoint, str) else checkpoint.info.id


def _line(info: CheckpointInfo, marks: Sequence[str]) -> str:
    parts = [info.id]
    if info.label is not None:
        parts.append(f'"{info.label}"')
    if info.labels:
        parts.append("[" + ", ".join(f"{k}={v}" for k, v in sorted(info.labels.items())) + "]")
    parts.append(info.process_state)
    parts.append(format_bytes(info.size_bytes) if info.size_bytes is not None else "(size pending)")
    parts.append(f"frozen {info.frozen_ms:.1f} ms")
    if marks:
        parts.append("◀ " + ", ".join(marks))
    return "  ".join(parts)


def format_bytes(n: int) -> str:
    """``n`` bytes for humans: ``512 B``, ``4.0 KiB``, ``1.2 MiB``."""
    if n < 1024:
        return f"{n} B"
    size = n / 1024
    for unit in ("KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"
