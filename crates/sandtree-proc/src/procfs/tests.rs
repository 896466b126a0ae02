//! The parsers of `procfs.rs` on text captured from a real `/proc`
//! (`tests/fixtures/procfs/`, made by its `capture.py`, which tells how
//! each file was made). Pids, inodes, fd numbers and addresses below are
//! the ones in those files.

use super::*;

macro_rules! fixture {
    ($name:literal) => {
        include_str!(concat!("../../tests/fixtures/procfs/", $name))
    };
}

const ODD_COMM_STAT: &str = fixture!("odd-comm.stat");
const ODD_COMM_STATUS: &str = fixture!("odd-comm.status");
const THREAD_STAT: &str = fixture!("thread.stat");
const THREAD_STATUS: &str = fixture!("thread.status");
const ZOMBIE_STAT: &str = fixture!("zombie.stat");
const ZOMBIE_STATUS: &str = fixture!("zombie.status");
const STOPPED_STAT: &str = fixture!("stopped.stat");
const STOPPED_STATUS: &str = fixture!("stopped.status");
const TRACED_STAT: &str = fixture!("traced.stat");
const TRACED_STATUS: &str = fixture!("traced.status");
const NESTED_STATUS: &str = fixture!("nested.status");
const TTY_STAT: &str = fixture!("tty.stat");
const MAPPER_MAPS: &str = fixture!("mapper.maps");
const MAPPER_AUXV: &[u8] = include_bytes!("../../tests/fixtures/procfs/mapper.auxv");
const MAPPER_TIMERS: &str = fixture!("mapper.timers");
const FD_LINKS: &str = fixture!("fd-links");
// (Not UTF-8: a comm cut inside a character, a Latin-1 file name.)
const CUT_COMM_STAT: &[u8] = include_bytes!("../../tests/fixtures/procfs/cut-comm.stat");
const CUT_COMM_STATUS: &[u8] = include_bytes!("../../tests/fixtures/procfs/cut-comm.status");
const CUT_COMM_MAPS: &[u8] = include_bytes!("../../tests/fixtures/procfs/cut-comm.maps");
const OVERLAY_LINKS: &str = fixture!("overlay-links");

/// `fdinfo/<name>` of the process that holds one descriptor of each kind.
const FDINFO: &[(&str, &str)] = &[
    ("file", fixture!("fdinfo/file")),
    ("file-append", fixture!("fdinfo/file-append")),
    ("file-locked", fixture!("fdinfo/file-locked")),
    ("file-spaced", fixture!("fdinfo/file-spaced")),
    ("file-deleted", fixture!("fdinfo/file-deleted")),
    ("directory", fixture!("fdinfo/directory")),
    ("dev-null", fixture!("fdinfo/dev-null")),
    ("pipe-read", fixture!("fdinfo/pipe-read")),
    ("pipe-write", fixture!("fdinfo/pipe-write")),
    ("fifo", fixture!("fdinfo/fifo")),
    ("eventfd", fixture!("fdinfo/eventfd")),
    ("eventfd-semaphore", fixture!("fdinfo/eventfd-semaphore")),
    ("timerfd-periodic", fixture!("fdinfo/timerfd-periodic")),
    ("timerfd-absolute", fixture!("fdinfo/timerfd-absolute")),
    ("timerfd-ticking", fixture!("fdinfo/timerfd-ticking")),
    ("signalfd", fixture!("fdinfo/signalfd")),
    ("epoll", fixture!("fdinfo/epoll")),
    ("inotify", fixture!("fdinfo/inotify")),
    ("inotify-overlay", fixture!("fdinfo/inotify-overlay")),
    ("fanotify", fixture!("fdinfo/fanotify")),
    ("pidfd", fixture!("fdinfo/pidfd")),
    ("memfd", fixture!("fdinfo/memfd")),
    ("socket-unix", fixture!("fdinfo/socket-unix")),
    ("socket-tcp-listening", fixture!("fdinfo/socket-tcp-listening")),
];

/// The kernel's `O_LARGEFILE`, which it sets on every file a 64-bit
/// process opens (and 64-bit libc defines as 0).
const O_LARGEFILE: i32 = 0o100000;

fn fdinfo_text(name: &str) -> &'static str {
    FDINFO.iter().find(|(n, _)| *n == name).map(|(_, t)| *t).unwrap_or_else(|| panic!("no fdinfo fixture {name}"))
}

/// The fd number and the link target of descriptor `name` (`fd-links`).
fn fd_link(name: &str) -> (i32, &'static str) {
    FD_LINKS
        .lines()
        .filter_map(|l| {
            let mut f = l.splitn(3, '\t');
            Some((f.next()?, f.next()?.parse().ok()?, f.next()?))
        })
        .find(|(n, _, _)| *n == name)
        .map(|(_, fd, target)| (fd, target))
        .unwrap_or_else(|| panic!("no fd-links line for {name}"))
}

// ------------------------------------------------------------------ stat

#[test]
fn state_is_read_after_the_last_parenthesis_of_the_comm() {
    assert_eq!(state_of_stat("42 (a) b) Z 1 42 42 0 -1"), Some('Z'));
    assert_eq!(state_of_stat("7 (python3) t 1 7 7"), Some('t'));
    assert_eq!(state_of_stat("garbage"), None);
}

#[test]
fn stat_of_a_comm_with_parentheses_and_spaces_gives_its_state() {
    // Arrange: `10424 (a) Z (b c) S 10423 10422 27341 0 ...`
    let stat = ODD_COMM_STAT;

    // Act
    let state = state_of_stat(stat);
    let fields: Vec<&str> = stat_fields(stat).take(5).collect();

    // Assert: not the `Z` inside the comm.
    assert_eq!(state, Some('S'));
    assert_eq!(fields, ["S", "10423", "10422", "27341", "0"]);
    assert_eq!(parse_tty_nr(stat), 0);
}

#[test]
fn stat_of_a_zombie_whose_comm_ends_in_a_parenthesis_gives_z() {
    // Arrange: `10429 (zombie)) Z 10423 ...`
    let stat = ZOMBIE_STAT;

    // Act
    let state = state_of_stat(stat);

    // Assert
    assert_eq!(state, Some('Z'));
    assert_eq!(stat_fields(stat).nth(1), Some("10423"));
}

#[test]
fn stat_of_a_zombie_gives_its_wait_status_and_exit_signal() {
    // Arrange: the fixture exited 0; the same with `exit(7)`'s status.
    let exited_7 = ZOMBIE_STAT.trim_end().strip_suffix(" 0").map(|s| format!("{s} 1792"));

    // Act
    let fixture = parse_exit_status(ZOMBIE_STAT);
    let seven = exited_7.as_deref().and_then(parse_exit_status);

    // Assert: fields 52 and 38.
    assert_eq!(fixture, Some((0, libc::SIGCHLD)));
    assert_eq!(seven, Some((7 << 8, libc::SIGCHLD)));
    assert_eq!(parse_exit_status("1 (short) Z 0 0"), None);
}

#[test]
fn stat_of_a_stopped_process_gives_uppercase_t() {
    assert_eq!(state_of_stat(STOPPED_STAT), Some('T'));
}

#[test]
fn stat_of_a_traced_process_gives_lowercase_t() {
    assert_eq!(state_of_stat(TRACED_STAT), Some('t'));
}

#[test]
fn stat_of_a_thread_named_with_parentheses_gives_its_state_and_thread_count() {
    // Arrange: `10428 (worker (1)) S ...`
    let stat = THREAD_STAT;

    // Act
    let state = state_of_stat(stat);
    let num_threads = stat_fields(stat).nth(17);

    // Assert
    assert_eq!(state, Some('S'));
    assert_eq!(num_threads, Some("2"));
}

#[test]
fn stat_of_a_process_with_a_controlling_terminal_gives_its_tty_nr() {
    // Arrange: a process on /dev/pts/0 (major 136, minor 0)
    let stat = TTY_STAT;

    // Act
    let tty = parse_tty_nr(stat);

    // Assert
    assert_eq!(tty, 136 << 8);
    assert_eq!(state_of_stat(stat), Some('S'));
    for without in [ODD_COMM_STAT, THREAD_STAT, ZOMBIE_STAT, STOPPED_STAT, TRACED_STAT] {
        assert_eq!(parse_tty_nr(without), 0);
    }
}

// ---------------------------------------------------------------- status

#[test]
fn status_of_a_comm_with_parentheses_and_spaces_gives_its_ids_masks_and_umask() {
    // Arrange: umask 027, gids 2000 2001 2002, SIGUSR1 blocked and pending
    // (shared), SIGUSR2 ignored, SIGINT and SIGTERM caught.
    let text = ODD_COMM_STATUS.to_string();

    // Act
    let st = parse_status(text);

    // Assert
    assert_eq!(st.state, 'S');
    assert_eq!(st.host_ppid, HostPid(10423));
    assert_eq!(
        (st.ns_pid, st.ns_pgid, st.ns_sid, st.ns_depth),
        (SandboxPid(10424), SandboxPid(10422), SandboxPid(27341), 1)
    );
    assert_eq!(st.threads, 1);
    assert_eq!(st.uids, [0, 0, 0, 0]);
    assert_eq!(st.gids, [2000, 2001, 2002, 2001]);
    assert_eq!(st.cap_eff, 0x1fffeffffff);
    assert_eq!(st.umask, 0o027);
    assert_eq!(st.signals.blocked, 1 << (libc::SIGUSR1 - 1));
    assert_eq!(st.signals.pending, 1 << (libc::SIGUSR1 - 1));
    assert_eq!(
        st.signals.ignored,
        (1 << (libc::SIGUSR2 - 1)) | (1 << (libc::SIGPIPE - 1)) | (1 << (libc::SIGXFSZ - 1))
    );
    assert_eq!(st.signals.caught, (1 << (libc::SIGINT - 1)) | (1 << (libc::SIGTERM - 1)));
    assert_eq!(st.tracer, HostPid(0));
    assert_eq!(st.text, ODD_COMM_STATUS);
}

#[test]
fn status_of_a_thread_gives_its_own_pid_its_tgid_and_the_thread_count() {
    // Arrange: /proc/10427/task/10428/status
    let text = THREAD_STATUS;

    // Act
    let st = parse_status(text.to_string());
    let tgid = parse_tgid(text);

    // Assert
    assert_eq!(st.ns_pid, SandboxPid(10428));
    assert_eq!(tgid, Some(10427));
    assert_eq!(st.threads, 2);
    assert_eq!(st.state, 'S');
    assert_eq!(st.umask, 0o022);
}

#[test]
fn status_of_a_zombie_gives_z_and_its_ids() {
    // Arrange: a zombie's status has no Umask line (nor memory lines).
    let text = ZOMBIE_STATUS;

    // Act
    let st = parse_status(text.to_string());

    // Assert
    assert_eq!(st.state, 'Z');
    assert_eq!((st.ns_pid, st.host_ppid, st.threads), (SandboxPid(10429), HostPid(10423), 1));
    assert_eq!(st.umask, 0);
    assert_eq!(parse_tgid(text), Some(10429));
}

#[test]
fn status_of_a_stopped_process_gives_t_and_its_uids_without_capabilities() {
    // Arrange: setresuid(1000, 1001, 1002) then SIGSTOP
    let text = STOPPED_STATUS.to_string();

    // Act
    let st = parse_status(text);

    // Assert
    assert_eq!(st.state, 'T');
    assert_eq!(st.uids, [1000, 1001, 1002, 1001]);
    assert_eq!(st.gids, [0, 0, 0, 0]);
    assert_eq!(st.cap_eff, 0);
    assert_eq!(st.tracer, HostPid(0));
}

#[test]
fn status_of_a_traced_process_gives_its_tracer() {
    // Arrange: PTRACE_ATTACH by its parent, 10423
    let text = TRACED_STATUS.to_string();

    // Act
    let st = parse_status(text);

    // Assert
    assert_eq!(st.state, 't');
    assert_eq!(st.tracer, HostPid(10423));
    assert_eq!(st.host_ppid, HostPid(10423));
}

#[test]
fn status_of_a_process_in_a_child_pid_namespace_gives_its_ids_there() {
    // Arrange: pid 2 of a new pid namespace, leading its process group,
    // in the session of the namespace's init (`NSpid: 10452 2`,
    // `NSpgid: 10452 2`, `NSsid: 10451 1`).
    let text = NESTED_STATUS.to_string();

    // Act
    let st = parse_status(text);

    // Assert
    assert_eq!((st.ns_pid, st.ns_pgid, st.ns_sid), (SandboxPid(2), SandboxPid(2), SandboxPid::INIT));
    assert_eq!(st.ns_depth, 2);
    assert_eq!(st.host_ppid, HostPid(10451));
}

#[test]
fn stat_status_and_maps_that_are_not_utf8_are_read() {
    // Arrange: a process named `sync-für-Größe`, cut by the kernel to 15
    // bytes inside the `ß`, mapping a file named `caf\xe9.bin`.
    let (stat, status, maps) = (CUT_COMM_STAT.to_vec(), CUT_COMM_STATUS.to_vec(), CUT_COMM_MAPS.to_vec());
    assert!(std::str::from_utf8(&status).is_err());

    // Act
    let stat = text_of(stat);
    let st = parse_status(text_of(status));
    let maps = parse_maps(&text_of(maps));

    // Assert
    assert_eq!(state_of_stat(&stat), Some('S'));
    assert_eq!(parse_tty_nr(&stat), 0);
    assert_eq!((st.state, st.ns_pid, st.host_ppid, st.threads), ('S', SandboxPid(10426), HostPid(10423), 1));
    assert!(st.text.starts_with("Name:\tsync-für-Grö\u{fffd}\n"), "{:?}", &st.text[..30]);
    let latin1 = maps.iter().find(|m| m.inode == 10035235).expect("the Latin-1 file");
    assert_eq!(latin1.path.as_deref(), Some("/tmp/sandtree-fixtures/caf\u{fffd}.bin"));
    assert_eq!((latin1.perms.as_str(), latin1.end - latin1.start), ("r--s", 4096));
    assert_eq!(maps.len(), 81);
}

// ------------------------------------------------------------------ maps

#[test]
fn maps_of_5000_mappings_of_alternating_protections_gives_each_one() {
    // Arrange: 5,000 one-page mappings between two inaccessible pages.
    let text = MAPPER_MAPS;

    // Act
    let maps = parse_maps(text);

    // Assert
    assert_eq!(maps.len(), text.lines().count());
    assert_eq!(maps.len(), 5086);
    let first = maps.iter().position(|m| m.start == 0x7f8c97ffc000).expect("the first of the 5,000");
    let run = &maps[first..first + 5000];
    for (i, m) in run.iter().enumerate() {
        assert_eq!(m.start, 0x7f8c97ffc000 + 4096 * i as u64);
        assert_eq!(m.end, m.start + 4096);
        assert_eq!(m.perms, if i % 2 == 0 { "r--p" } else { "rw-p" });
        assert_eq!((m.offset, m.dev, m.inode, m.path.as_deref()), (0, 0, 0, None));
    }
    assert_eq!(run[4999].end, 0x7f8c99384000);
    assert_eq!((maps[first - 1].perms.as_str(), maps[first + 5000].perms.as_str()), ("---p", "---p"));
}

#[test]
fn maps_keeps_a_path_with_a_space_and_a_deleted_files_suffix() {
    // Arrange
    let maps = parse_maps(MAPPER_MAPS);
    let find = |start: u64| maps.iter().find(|m| m.start == start).expect("mapping");

    // Act
    let spaced = find(0x7f8c99b19000);
    let deleted = find(0x7f8c9940e000);

    // Assert
    let dev = libc::makedev(0xfe, 0);
    assert_eq!(
        spaced,
        &MapImage {
            start: 0x7f8c99b19000,
            end: 0x7f8c99b1b000,
            perms: "r--s".into(),
            offset: 0,
            path: Some("/tmp/sandtree-fixtures/with space.bin".into()),
            dev,
            inode: 10035254,
            dont_fork: false,
            advice: Vec::new(),
        }
    );
    assert!(spaced.shared());
    assert_eq!(deleted.path.as_deref(), Some("/tmp/sandtree-fixtures/gone.bin (deleted)"));
    assert_eq!((deleted.perms.as_str(), deleted.dev, deleted.inode), ("rw-p", dev, 10035265));
}

#[test]
fn maps_names_a_memfd_and_shared_anonymous_memory() {
    // Arrange
    let maps = parse_maps(MAPPER_MAPS);

    // Act
    let memfd = maps.iter().find(|m| m.start == 0x7f8c9940d000).expect("memfd");
    let shared_anon = maps.iter().find(|m| m.start == 0x7f8c9940c000).expect("shared anonymous");

    // Assert
    assert_eq!(memfd.path.as_deref(), Some("/memfd:a buf (deleted)"));
    assert_eq!((memfd.perms.as_str(), memfd.dev, memfd.inode), ("rw-s", libc::makedev(0, 1), 145));
    assert_eq!(shared_anon.path.as_deref(), Some("/dev/zero (deleted)"));
    assert_eq!((shared_anon.perms.as_str(), shared_anon.end, shared_anon.inode), ("rw-s", 0x7f8c9940d000, 146));
}

#[test]
fn maps_names_heap_stack_vdso_vvar_and_vsyscall() {
    // Arrange
    let maps = parse_maps(MAPPER_MAPS);

    // Act
    let named = |name: &str| maps.iter().find(|m| m.path.as_deref() == Some(name)).map(|m| (m.start, m.end, &*m.perms));

    // Assert
    assert_eq!(named("[heap]"), Some((0x4048c000, 0x40701000, "rw-p")));
    assert_eq!(named("[stack]"), Some((0x7ffdf2f70000, 0x7ffdf2f91000, "rw-p")));
    assert_eq!(named("[vvar]"), Some((0x7f8c99b24000, 0x7f8c99b28000, "r--p")));
    assert_eq!(named("[vvar_vclock]"), Some((0x7f8c99b28000, 0x7f8c99b2a000, "r--p")));
    assert_eq!(named("[vdso]"), Some((0x7f8c99b2a000, 0x7f8c99b2c000, "r-xp")));
    assert_eq!(named("[vsyscall]"), Some((0xffffffffff600000, 0xffffffffff601000, "--xp")));
}

#[test]
fn maps_of_a_library_gives_its_offset_device_and_inode() {
    // Arrange: `7f8c99833000-7f8c99989000 r-xp 00026000 fe:00 326279 .../libc.so.6`
    let maps = parse_maps(MAPPER_MAPS);

    // Act
    let text = maps.iter().find(|m| m.start == 0x7f8c99833000).expect("libc's text");

    // Assert
    assert_eq!(text.end, 0x7f8c99989000);
    assert_eq!(text.perms, "r-xp");
    assert_eq!(text.offset, 0x26000);
    assert_eq!((text.dev, text.inode), (libc::makedev(0xfe, 0), 326279));
    assert_eq!(text.path.as_deref(), Some("/usr/lib/x86_64-linux-gnu/libc.so.6"));
}

#[test]
fn cow_ranges_are_the_private_writable_mappings_but_vsyscall() {
    // Arrange
    let text = MAPPER_MAPS;
    let maps = parse_maps(text);

    // Act
    let ranges: Vec<(u64, u64)> = parse_cow_ranges(text).collect();

    // Assert: the 2,500 writable pages of the run, the heap, the stack, the
    // private deleted file, and the data of the binary and libraries; not
    // the shared memfd, /dev/zero or file.
    assert_eq!(ranges.len(), 2523);
    let expected: Vec<(u64, u64)> = maps.iter().filter(|m| m.perms == "rw-p").map(|m| (m.start, m.end)).collect();
    assert_eq!(ranges, expected);
    assert!(ranges.contains(&(0x4048c000, 0x40701000)));
    assert!(ranges.contains(&(0x7f8c9940e000, 0x7f8c9940f000)));
    assert!(!ranges.iter().any(|r| r.0 == 0x7f8c9940d000 || r.0 == 0xffffffffff600000));
}

#[test]
fn cow_ranges_leave_out_reservations_larger_than_a_terabyte() {
    // Arrange: the stack line of the fixture, widened to 2 TB below.
    let line = MAPPER_MAPS.lines().find(|l| l.ends_with("[stack]")).expect("stack line");
    let wide = line.replacen("7ffdf2f70000", "7dfdf2f70000", 1);

    // Act
    let kept: Vec<(u64, u64)> = parse_cow_ranges(line).collect();
    let reserved: Vec<(u64, u64)> = parse_cow_ranges(&wide).collect();

    // Assert
    assert_eq!(kept, [(0x7ffdf2f70000, 0x7ffdf2f91000)]);
    assert_eq!(reserved, []);
}

#[cfg(all(target_endian = "little", target_pointer_width = "64"))]
#[test]
fn auxv_gives_the_vdso_base_that_maps_shows() {
    // Arrange: auxv and maps of the same process
    let auxv = MAPPER_AUXV;

    // Act
    let base = parse_vdso_base(auxv);

    // Assert
    assert_eq!(base, Some(0x7f8c99b2a000));
    let vdso = parse_maps(MAPPER_MAPS).into_iter().find(|m| m.path.as_deref() == Some("[vdso]")).map(|m| m.start);
    assert_eq!(base, vdso);
    // (It is the first pair.)
    assert_eq!(parse_vdso_base(&auxv[..15]), None);
    assert_eq!(parse_vdso_base(&auxv[16..]), None);
}

#[test]
fn timers_of_a_process_with_a_posix_timer_list_it() {
    // Arrange: `ID: 0`, `ClockID: 1`
    let timers = MAPPER_TIMERS;

    // Act
    let listed = parse_has_posix_timers(timers);

    // Assert
    assert!(listed);
    assert!(!parse_has_posix_timers(""));
    assert_eq!(field(timers, "ClockID"), Some("1"));
}

// ---------------------------------------------------------------- fdinfo

#[test]
fn fdinfo_of_a_regular_file_gives_its_position_flags_and_mount() {
    // Arrange: plain.txt opened O_RDWR, at offset 5, on / (mount 27)
    let text = fdinfo_text("file").to_string();

    // Act
    let info = parse_fdinfo(text);

    // Assert
    assert_eq!(info.pos, 5);
    assert_eq!(info.flags, (libc::O_RDWR | O_LARGEFILE | libc::O_CLOEXEC) as u32);
    assert_eq!(info.mnt_id, 27);
    assert_eq!(info.locks(), (Vec::new(), false));
    assert_eq!(parse_fd_link(fd_link("file").1), Link::Path);
}

#[test]
fn fdinfo_of_a_file_opened_to_append_gives_its_flags() {
    // Arrange
    let text = fdinfo_text("file-append").to_string();

    // Act
    let info = parse_fdinfo(text);

    // Assert
    let want = libc::O_WRONLY | libc::O_APPEND | libc::O_NONBLOCK | O_LARGEFILE | libc::O_CLOEXEC;
    assert_eq!(info.flags, want as u32);
    assert_eq!((info.pos, info.mnt_id), (0, 27));
}

#[test]
fn fdinfo_of_a_deleted_file_gives_its_position_and_its_link_the_path() {
    // Arrange: 10 bytes written, then unlinked
    let text = fdinfo_text("file-deleted").to_string();
    let (fd, link) = fd_link("file-deleted");

    // Act
    let info = parse_fdinfo(text);
    let target = parse_fd_link(link);

    // Assert
    assert_eq!(fd, 7);
    assert_eq!((info.pos, info.mnt_id), (10, 27));
    assert_eq!(target, Link::Deleted("/tmp/sandtree-fixtures/gone.txt"));
}

#[test]
fn fdinfo_of_a_flocked_file_shows_a_lock() {
    // Arrange: `lock:	1: FLOCK  ADVISORY  WRITE ...`
    let text = fdinfo_text("file-locked").to_string();

    // Act
    let info = parse_fdinfo(text);

    // Assert
    let flock =
        crate::model::FileLock { kind: crate::model::LockKind::Flock, write: true, start: 0, end: None, signal: 0 };
    assert_eq!(info.locks(), (vec![flock], false));
    assert_eq!((info.pos, info.mnt_id), (0, 27));
    for (name, text) in FDINFO.iter().filter(|(n, _)| *n != "file-locked") {
        assert_eq!(parse_fdinfo(text.to_string()).locks(), (Vec::new(), false), "{name}");
    }
}

#[test]
fn lock_lines_give_each_lock_held_and_say_when_one_cannot_be_taken_again() {
    use crate::model::{FileLock, LockKind};
    let text = "pos:\t0\nflags:\t02\nmnt_id:\t27\n\
lock:\t1: POSIX  ADVISORY  READ 29733 fe:00:10111187 1073741826 1073742335\n\
lock:\t2: OFDLCK ADVISORY  WRITE -1 fe:00:10111200 120 120\n\
lock:\t3: -> POSIX  ADVISORY  WRITE 29800 fe:00:10111200 120 120\n";
    let (locks, other) = parse_locks(text);
    assert_eq!(
        locks,
        vec![
            FileLock { kind: LockKind::Posix, write: false, start: 1073741826, end: Some(1073742335), signal: 0 },
            FileLock { kind: LockKind::Ofd, write: true, start: 120, end: Some(120), signal: 0 },
        ]
    );
    assert!(!other, "a waiter is not a lock held");
    let lease = "lock:\t1: LEASE  ACTIVE    WRITE 100 fe:00:1 0 EOF\n";
    let held = FileLock { kind: LockKind::Lease, write: true, start: 0, end: None, signal: 0 };
    assert_eq!(parse_locks(lease), (vec![held], false));
    let breaking = "lock:\t1: LEASE  BREAKING  READ 100 fe:00:1 0 EOF\n";
    assert_eq!(parse_locks(breaking), (Vec::new(), true), "a lease being broken is refused");
}

#[test]
fn fdinfo_of_a_directory_and_dev_null_give_their_flags_and_mounts() {
    // Arrange
    let (dir, null) = (fdinfo_text("directory").to_string(), fdinfo_text("dev-null").to_string());

    // Act
    let (dir, null) = (parse_fdinfo(dir), parse_fdinfo(null));

    // Assert
    assert_eq!(dir.flags, (libc::O_RDONLY | libc::O_DIRECTORY | O_LARGEFILE | libc::O_CLOEXEC) as u32);
    assert_eq!(dir.mnt_id, 27);
    assert_eq!(null.flags, (libc::O_WRONLY | O_LARGEFILE | libc::O_CLOEXEC) as u32);
    assert_eq!(null.mnt_id, 24);
    assert_eq!(parse_fd_link(fd_link("dev-null").1), Link::Path);
}

#[test]
fn fdinfo_of_a_pipe_gives_each_ends_access_mode_and_its_link_the_inode() {
    // Arrange
    let (read_end, write_end) = (fdinfo_text("pipe-read").to_string(), fdinfo_text("pipe-write").to_string());

    // Act
    let (r, w) = (parse_fdinfo(read_end), parse_fdinfo(write_end));
    let (r_link, w_link) = (parse_fd_link(fd_link("pipe-read").1), parse_fd_link(fd_link("pipe-write").1));

    // Assert
    assert_eq!(r.flags, (libc::O_RDONLY | libc::O_CLOEXEC) as u32);
    assert_eq!(w.flags, (libc::O_WRONLY | libc::O_CLOEXEC) as u32);
    assert_eq!((r.mnt_id, w.mnt_id), (16, 16));
    assert_eq!(r_link, Link::Pipe(1665335));
    assert_eq!(w_link, Link::Pipe(1665335));
    assert_eq!(field(&r.text, "ino"), Some("1665335"));
    assert_eq!(parse_anon_state("pipe", &r.text), None);
}

#[test]
fn fdinfo_of_an_eventfd_gives_its_count() {
    // Arrange: eventfd(42) and eventfd(3, EFD_SEMAPHORE | EFD_NONBLOCK)
    let (plain, semaphore) = (fdinfo_text("eventfd"), fdinfo_text("eventfd-semaphore"));

    // Act
    let (plain_state, semaphore_state) = (parse_anon_state("eventfd", plain), parse_anon_state("eventfd", semaphore));

    // Assert
    assert_eq!(plain_state, Some(AnonState::Eventfd { count: 42, semaphore: false }));
    assert_eq!(semaphore_state, Some(AnonState::Eventfd { count: 3, semaphore: true }));
    let flags = parse_fdinfo(semaphore.to_string()).flags;
    assert_eq!(flags, (libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC) as u32);
    assert_eq!(parse_fd_link(fd_link("eventfd").1), Link::Anon("eventfd"));
}

#[test]
fn fdinfo_of_a_timerfd_gives_its_clock_and_times() {
    // Arrange: CLOCK_MONOTONIC, in 100.25 s then every 1.5 s (read 53 ms
    // later); CLOCK_REALTIME, at 2100-01-01 (TFD_TIMER_ABSTIME: fdinfo
    // shows the time left).
    let (periodic, absolute) = (fdinfo_text("timerfd-periodic"), fdinfo_text("timerfd-absolute"));

    // Act
    let (periodic, absolute) = (parse_anon_state("timerfd", periodic), parse_anon_state("timerfd", absolute));

    // Assert
    assert_eq!(
        periodic,
        Some(AnonState::Timerfd {
            clockid: libc::CLOCK_MONOTONIC,
            value_ns: 100_196_865_660,
            interval_ns: 1_500_000_000,
            ticks: 0
        })
    );
    assert_eq!(
        absolute,
        Some(AnonState::Timerfd {
            clockid: libc::CLOCK_REALTIME,
            value_ns: 2_305_920_431_435_299_697,
            interval_ns: 0,
            ticks: 0
        })
    );
    assert_eq!(parse_fd_link(fd_link("timerfd-periodic").1), Link::Anon("timerfd"));
}

#[test]
fn fdinfo_of_an_expired_periodic_timerfd_gives_its_unread_ticks() {
    // Arrange: CLOCK_BOOTTIME every ms, unread for 50 ms: fdinfo shows it
    // disarmed (`it_value: (0, 0)`) with one tick (what `anon_state`
    // corrects with timerfd_gettime on a live descriptor).
    let text = fdinfo_text("timerfd-ticking");

    // Act
    let state = parse_anon_state("timerfd", text);

    // Assert
    assert_eq!(
        state,
        Some(AnonState::Timerfd { clockid: libc::CLOCK_BOOTTIME, value_ns: 0, interval_ns: 1_000_000, ticks: 1 })
    );
}

#[test]
fn fdinfo_of_a_signalfd_gives_its_mask() {
    // Arrange: signalfd of SIGUSR1 and SIGUSR2 (`sigmask: 0000000000000a00`)
    let text = fdinfo_text("signalfd");

    // Act
    let state = parse_anon_state("signalfd", text);

    // Assert
    assert_eq!(state, Some(AnonState::Signalfd { mask: (1 << (libc::SIGUSR1 - 1)) | (1 << (libc::SIGUSR2 - 1)) }));
    assert_eq!(parse_fd_link(fd_link("signalfd").1), Link::Anon("signalfd"));
}

#[test]
fn fdinfo_of_an_epoll_gives_its_watches() {
    // Arrange: the pipe's read end (EPOLLIN | EPOLLET, data
    // 0x1122334455667788), the eventfd (EPOLLIN | EPOLLOUT, 7) and the
    // signalfd (EPOLLIN, 0); the kernel adds EPOLLERR | EPOLLHUP.
    let text = fdinfo_text("epoll");
    let err_hup = (libc::EPOLLERR | libc::EPOLLHUP) as u32;

    // Act
    let watches = epoll_watches(text);

    // Assert
    assert_eq!(
        watches,
        [
            (fd_link("eventfd").0, libc::EPOLLIN as u32 | libc::EPOLLOUT as u32 | err_hup, 7),
            (fd_link("pipe-read").0, libc::EPOLLIN as u32 | libc::EPOLLET as u32 | err_hup, 0x1122334455667788),
            (fd_link("signalfd").0, libc::EPOLLIN as u32 | err_hup, 0),
        ]
    );
    assert_eq!(watches[0].0, 13);
    assert_eq!(parse_anon_state("eventpoll", text), Some(AnonState::Epoll { watches, stale: Vec::new() }));
    assert_eq!(parse_fd_link(fd_link("epoll").1), Link::Anon("eventpoll"));
}

#[test]
fn fdinfo_of_an_inotify_gives_each_watch_with_its_file_handle() {
    // Arrange: watches on the capture's directory (IN_CREATE | IN_DELETE)
    // and a file in it (IN_MODIFY | IN_CLOSE_WRITE), on ext4 (254:0).
    let text = fdinfo_text("inotify");

    // Act
    let watches: Vec<WatchLine> = parse_inotify_watches(text).collect::<Result<_, _>>().expect("parsed");

    // Assert
    let ext4 =
        MountEntry { id: 27, dev: (254, 0), target: "/".into(), fstype: "ext4".into(), super_options: "rw".into() };
    assert_eq!(
        watches,
        [
            WatchLine {
                wd: 2,
                ino: 0x992041,
                sdev: ext4.kernel_dev(),
                mask: libc::IN_MODIFY | libc::IN_CLOSE_WRITE,
                handle_type: Some(1),
                handle: Some(vec![0x41, 0x20, 0x99, 0x00, 0x95, 0xe1, 0xdf, 0xef]),
            },
            WatchLine {
                wd: 1,
                ino: 0x992013,
                sdev: 0xfe00000,
                mask: libc::IN_CREATE | libc::IN_DELETE,
                handle_type: Some(1),
                handle: Some(vec![0x13, 0x20, 0x99, 0x00, 0xa3, 0xe8, 0xe3, 0xff]),
            },
        ]
    );
    // (ext4's FILEID_INO32_GEN: the inode number, then its generation.)
    for w in &watches {
        let handle = w.handle.as_deref().expect("handle");
        assert_eq!(u32::from_le_bytes(handle[..4].try_into().expect("4 bytes")) as u64, w.ino);
        assert_eq!(parse_overlay_handle(w.handle_type, Some(handle)), None);
    }
    assert_eq!(parse_fd_link(fd_link("inotify").1), Link::Anon("inotify"));
    assert_eq!(parse_anon_state("inotify", text), None);
}

#[test]
fn fdinfo_of_an_inotify_on_an_overlay_gives_each_watchs_layer_and_inner_handle() {
    // Arrange: watches through an overlay of tmpfs layers on the merged
    // directory (upper), upper.txt (upper) and lower-only.txt (lower).
    let text = fdinfo_text("inotify-overlay");
    let ino = |name: &str| -> u64 {
        OVERLAY_LINKS
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix('\t')?.parse().ok())
            .expect("overlay-links")
    };

    // Act
    let watches: Vec<WatchLine> = parse_inotify_watches(text).collect::<Result<_, _>>().expect("parsed");
    let handles: Vec<OverlayHandle> = watches
        .iter()
        .map(|w| parse_overlay_handle(w.handle_type, w.handle.as_deref()).expect("an overlay handle"))
        .collect();

    // Assert
    let seen: Vec<(i32, u64, u64, u32, bool)> =
        watches.iter().zip(&handles).map(|(w, h)| (w.wd, w.ino, w.sdev, w.mask, h.upper)).collect();
    assert_eq!(
        seen,
        [
            (3, ino("ino-lower-only.txt"), 0x44, libc::IN_ATTRIB, false),
            (2, ino("ino-upper.txt"), 0x44, libc::IN_MODIFY, true),
            (1, ino("ino-merged"), 0x44, libc::IN_CREATE, true),
        ]
    );
    assert_eq!(watches[0].handle_type, Some(0xf8));
    // tmpfs's handle (type 1): generation, then the inode number's halves.
    for (w, h) in watches.iter().zip(&handles) {
        assert_eq!((h.inner_type, h.inner.len()), (1, 12));
        assert_eq!(u32::from_le_bytes(h.inner[4..8].try_into().expect("4 bytes")) as u64, w.ino);
        assert_eq!(&h.inner[8..], [0; 4]);
    }
    assert_eq!(handles[0].inner[..4], [0x42, 0x80, 0x05, 0xba]);
}

#[test]
fn overlay_handle_of_another_version_or_cut_short_is_read_or_refused() {
    // Arrange: the lower-only file's OVL_FILEID_V1 handle (3 bytes of
    // padding, then the ovl_fb)
    let watch = parse_inotify_watches(fdinfo_text("inotify-overlay")).next().expect("a watch").expect("parsed");
    let v1 = watch.handle.expect("handle");

    // Act: the same ovl_fb as an OVL_FILEID_V0 handle; cut; not overlay's
    let v0 = parse_overlay_handle(Some(0xfb), Some(&v1[3..]));
    let cut = parse_overlay_handle(Some(0xf8), Some(&v1[..v1.len() - 1]));
    let header_only = parse_overlay_handle(Some(0xf8), Some(&v1[..24]));
    let other_type = parse_overlay_handle(Some(1), Some(&v1));

    // Assert
    assert_eq!(v0, parse_overlay_handle(Some(0xf8), Some(&v1)));
    assert_eq!(v0.map(|h| (h.upper, h.inner_type, h.inner.len())), Some((false, 1, 12)));
    assert_eq!(cut, None);
    assert_eq!(header_only, None);
    assert_eq!(other_type, None);
    assert_eq!(parse_overlay_handle(Some(0xf8), None), None);
}

#[test]
fn fdinfo_of_a_fanotify_has_no_inotify_watch_and_no_state() {
    // Arrange: `fanotify ino:992013 sdev:fe00000 ... f_handle:...`
    let text = fdinfo_text("fanotify");

    // Act
    let watches = parse_inotify_watches(text).count();

    // Assert
    assert_eq!(watches, 0);
    assert_eq!(parse_anon_state("fanotify", text), None);
    assert_eq!(parse_fd_link(fd_link("fanotify").1), Link::Anon("fanotify"));
    assert_eq!(parse_fdinfo(text.to_string()).flags, (libc::O_RDWR | libc::O_CLOEXEC) as u32);
}

#[test]
fn fdinfo_of_a_pidfd_gives_its_pid_as_its_state() {
    // Arrange: pidfd_open of the capture's parent, 10423
    let text = fdinfo_text("pidfd");

    // Act
    let info = parse_fdinfo(text.to_string());

    // Assert
    assert_eq!((info.flags, info.mnt_id), ((libc::O_RDWR | libc::O_CLOEXEC) as u32, 4));
    assert_eq!(field(text, "Pid"), Some("10423"));
    assert_eq!(parse_tgid(text), None);
    // (The capture ran in the host's pid namespace: NSpid has one pid.)
    assert_eq!(parse_anon_state("pidfd", text), Some(AnonState::Pidfd { pid: SandboxPid(10423) }));
    assert_eq!(parse_fd_link(fd_link("pidfd").1), Link::Anon("pidfd"));
}

#[test]
fn fdinfo_of_a_memfd_gives_its_position_and_its_link_the_name() {
    // Arrange: memfd_create("a buf"), 100 bytes written
    let text = fdinfo_text("memfd").to_string();

    // Act
    let info = parse_fdinfo(text);
    let link = parse_fd_link(fd_link("memfd").1);

    // Assert
    assert_eq!((info.pos, info.mnt_id), (100, 0));
    assert_eq!(info.flags, (libc::O_RDWR | O_LARGEFILE | libc::O_CLOEXEC) as u32);
    assert_eq!(link, Link::Memfd("a buf"));
}

#[test]
fn fdinfo_of_a_socket_gives_the_sockfs_mount_and_its_link_the_inode() {
    // Arrange: one end of a unix socketpair, a listening TCP socket
    let (unix, tcp) = (fdinfo_text("socket-unix").to_string(), fdinfo_text("socket-tcp-listening").to_string());

    // Act
    let (unix, tcp) = (parse_fdinfo(unix), parse_fdinfo(tcp));

    // Assert
    assert_eq!((unix.flags, unix.mnt_id), ((libc::O_RDWR | libc::O_CLOEXEC) as u32, 10));
    assert_eq!((tcp.flags, tcp.mnt_id), ((libc::O_RDWR | libc::O_CLOEXEC) as u32, 10));
    assert_eq!(parse_fd_link(fd_link("socket-unix").1), Link::Socket(1665336));
    assert_eq!(parse_fd_link(fd_link("socket-tcp-listening").1), Link::Socket(1665338));
    assert_eq!(field(&tcp.text, "ino"), Some("1665338"));
}

#[test]
fn fd_links_of_paths_name_no_special_kind() {
    // Arrange: a path with a space, a directory, a fifo, /dev/null
    let names = ["file-spaced", "file-locked", "directory", "fifo", "dev-null"];

    // Act
    let kinds: Vec<Link> = names.iter().map(|n| parse_fd_link(fd_link(n).1)).collect();

    // Assert
    assert_eq!(kinds, [Link::Path; 5]);
    assert_eq!(fd_link("file-spaced").1, "/tmp/sandtree-fixtures/with space.txt");
}

#[test]
fn fd_links_of_every_kind_in_the_fixture_are_told_apart() {
    // Arrange
    let links: Vec<(&str, &str)> =
        FD_LINKS.lines().filter_map(|l| Some((l.split('\t').next()?, l.split('\t').nth(2)?))).collect();

    // Act
    let kinds: Vec<(&str, Link)> = links.iter().map(|(n, l)| (*n, parse_fd_link(l))).collect();

    // Assert: each kind, one descriptor each
    assert_eq!(kinds.len(), FDINFO.len() - 1, "one fdinfo fixture per link, and the overlay's");
    for (name, kind) in kinds {
        let want = match name {
            n if n.starts_with("pipe") => Link::Pipe(1665335),
            "socket-unix" => Link::Socket(1665336),
            "socket-tcp-listening" => Link::Socket(1665338),
            n if n.starts_with("eventfd") => Link::Anon("eventfd"),
            n if n.starts_with("timerfd") => Link::Anon("timerfd"),
            "signalfd" | "inotify" | "fanotify" | "pidfd" => Link::Anon(name),
            "epoll" => Link::Anon("eventpoll"),
            "memfd" => Link::Memfd("a buf"),
            "file-deleted" => Link::Deleted("/tmp/sandtree-fixtures/gone.txt"),
            _ => Link::Path,
        };
        assert_eq!(kind, want, "{name}");
    }
}

#[test]
fn kept_mounts_are_proc_and_dev_but_not_dev_shm() {
    // Arrange
    let mount = |target: &str| MountEntry {
        id: 1,
        dev: (0, 1),
        target: target.into(),
        fstype: "tmpfs".into(),
        super_options: String::new(),
    };

    // Act
    let kept: Vec<bool> = ["/proc", "/proc/sys", "/dev", "/dev/pts", "/dev/shm", "/dev/shm/x", "/devices", "/", "/tmp"]
        .iter()
        .map(|t| kept_mount(&mount(t)))
        .collect();

    // Assert
    assert_eq!(kept, [true, true, true, true, false, false, false, false, false]);
}

// ------------------------------------------------------------ robustness

/// Every text parser of this module on `text`; none may panic.
fn every_parser(text: &str) {
    use std::hint::black_box;
    black_box(state_of_stat(text));
    black_box(parse_tty_nr(text));
    black_box(stat_fields(text).count());
    black_box(parse_status(text.to_string()));
    black_box(parse_tgid(text));
    let info = parse_fdinfo(text.to_string());
    black_box(info.locks());
    for what in ["eventfd", "timerfd", "eventpoll", "signalfd", "pidfd", "fanotify"] {
        black_box(parse_anon_state(what, text));
    }
    for w in parse_inotify_watches(text).flatten() {
        black_box(parse_overlay_handle(w.handle_type, w.handle.as_deref()));
        black_box(parse_overlay_handle(Some(0xfb), w.handle.as_deref()));
    }
    black_box(epoll_watches(text));
    black_box(parse_fd_link(text));
    for line in text.lines() {
        black_box(parse_fd_link(line));
    }
    black_box(parse_maps(text));
    black_box(parse_cow_ranges(text).count());
    black_box(parse_has_posix_timers(text));
    black_box(parse_vdso_base(text.as_bytes()));
}

/// The text fixtures, the large `maps` cut to its first and last 100 lines.
fn text_fixtures() -> Vec<(&'static str, String)> {
    let lines: Vec<&str> = MAPPER_MAPS.lines().collect();
    let maps_ends = [&lines[..100], &lines[lines.len() - 100..]].concat().join("\n") + "\n";
    let mut all: Vec<(&str, String)> = vec![
        ("odd-comm.stat", ODD_COMM_STAT.into()),
        ("odd-comm.status", ODD_COMM_STATUS.into()),
        ("thread.stat", THREAD_STAT.into()),
        ("thread.status", THREAD_STATUS.into()),
        ("zombie.stat", ZOMBIE_STAT.into()),
        ("zombie.status", ZOMBIE_STATUS.into()),
        ("stopped.stat", STOPPED_STAT.into()),
        ("stopped.status", STOPPED_STATUS.into()),
        ("traced.stat", TRACED_STAT.into()),
        ("traced.status", TRACED_STATUS.into()),
        ("nested.status", NESTED_STATUS.into()),
        ("tty.stat", TTY_STAT.into()),
        ("mapper.timers", MAPPER_TIMERS.into()),
        ("fd-links", FD_LINKS.into()),
        ("mapper.maps (ends)", maps_ends),
    ];
    all.extend(FDINFO.iter().map(|(n, t)| (*n, t.to_string())));
    all
}

/// Every prefix of `text` (on a character boundary) to [`every_parser`].
fn every_prefix(name: &str, text: &str) {
    for end in (0..=text.len()).filter(|&i| text.is_char_boundary(i)) {
        let prefix = &text[..end];
        let outcome = std::panic::catch_unwind(|| every_parser(prefix));
        assert!(outcome.is_ok(), "{name} cut at byte {end} ({:?}...)", &prefix[prefix.len().saturating_sub(40)..]);
    }
}

#[test]
fn every_prefix_of_every_fixture_parses_without_panicking() {
    for (name, text) in text_fixtures() {
        if text.len() <= 4096 {
            every_prefix(name, &text);
        } else {
            // (The parsers read line by line: each line's prefixes, then
            // the text's at each line's end.)
            for line in text.lines() {
                every_prefix(name, line);
            }
            for (end, _) in text.match_indices('\n') {
                every_parser(&text[..end]);
            }
        }
    }
    for end in 0..=MAPPER_AUXV.len() {
        assert!(parse_vdso_base(&MAPPER_AUXV[..end]).is_none_or(|b| b == 0x7f8c99b2a000));
    }
}

#[test]
fn a_prefix_of_the_huge_maps_cut_at_a_line_gives_its_first_mappings() {
    // Arrange
    let full = parse_maps(MAPPER_MAPS);
    let ends: Vec<usize> = MAPPER_MAPS.match_indices('\n').map(|(i, _)| i + 1).collect();

    // Act & Assert: every 197th line, and inside it
    for (n, &end) in ends.iter().enumerate().step_by(197) {
        assert_eq!(parse_maps(&MAPPER_MAPS[..end]), full[..=n]);
        let inside = parse_maps(&MAPPER_MAPS[..end - 30]);
        assert_eq!(inside[..n], full[..n]);
        every_parser(&MAPPER_MAPS[..end - 30]);
    }
    every_parser(MAPPER_MAPS);
}

/// xorshift64: garbling reproducible without a dependency.
struct Garbler(u64);

impl Garbler {
    fn next(&mut self, below: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % below as u64) as usize
    }

    /// `text` with a few bytes replaced, removed or repeated.
    fn garble(&mut self, text: &str) -> String {
        const TRICKY: &[u8] = b" \t\n:()[]-,0123456789abcdefxX\xff";
        let mut b = text.as_bytes().to_vec();
        for _ in 0..1 + self.next(8) {
            if b.is_empty() {
                break;
            }
            let at = self.next(b.len());
            match self.next(3) {
                0 => b[at] = TRICKY[self.next(TRICKY.len())],
                1 => drop(b.drain(at..(at + self.next(16)).min(b.len()))),
                _ => {
                    let piece = b[at..(at + self.next(24)).min(b.len())].to_vec();
                    b.splice(at..at, piece);
                }
            }
        }
        String::from_utf8_lossy(&b).into_owned()
    }
}

#[test]
fn garbled_fixtures_parse_without_panicking() {
    let mut g = Garbler(0x5eed_1234_abcd_0001);
    for (name, text) in text_fixtures() {
        for round in 0..200 {
            let garbled = g.garble(&text);
            let outcome = std::panic::catch_unwind(|| every_parser(&garbled));
            assert!(outcome.is_ok(), "{name}, garbling {round}: {garbled:?}");
        }
    }
    let extremes = [
        "pos:\t99999999999999999999999\nflags:\t77777777777777777\nmnt_id:\t-99999999999\n",
        "it_value: (18446744073709551615, 18446744073709551615)\nit_interval: (,)\nclockid: x\nticks: -1\n",
        "it_value: 18446744073709551615\nit_interval: ((((\n",
        "tfd: 1 events: data:\ntfd: -5 events: ffffffffff data: fffffffffffffffffff\n",
        "inotify wd:ffffffffffffffffff ino:1 sdev:1 mask:1ffffffff fhandle-type:f8 f_handle:0\n",
        "inotify wd:1 ino:1 sdev:1 mask:1 fhandle-type:f8 f_handle:000000fbff\n",
        "inotify wd:1 ino:1 sdev:1 mask:1 fhandle-type:f8 f_handle:000000fbff16ff\n",
        "inotify wd:1 ino:1 sdev:1 mask:1 fhandle-type:fb f_handle:é1\n",
        "ffffffffffff0000-0000000000001000 rw-p 0 fe:00 0 /x\n-\n- - - - - -\n",
        "7f0000000000-7f0000001000 rw-p zz zz:zz zz\n1-2 3\n",
        "1) 2) 3)\n)\n(\n",
        "Uid:\t1\t2\nGid:\nNSpid:\nUmask:\t9999\nSigPnd:\tfffffffffffffffffff\nState:\n",
        "anon_inode:\nsocket:[\npipe:[]\n/memfd:\n (deleted)\n",
        "",
    ];
    for text in extremes {
        every_parser(text);
    }
}

// ------------------------------------------------------------------ live

#[test]
fn state_of_a_running_process_and_of_a_missing_one() {
    assert!(matches!(state(HostPid(std::process::id() as i32)), Some('R' | 'S')));
    assert_eq!(state(HostPid(i32::MAX)), None);
}

#[test]
fn readers_of_a_process_whose_executable_has_a_latin1_name_read_it() {
    // Arrange: `sleep` copied beside this test binary as `sl\xe9ep-<pid>`
    // (its comm and the path in its maps are not UTF-8), and run.
    use std::os::unix::ffi::OsStrExt;
    let sleep = ["/usr/bin/sleep", "/bin/sleep"].into_iter().find(|p| Path::new(p).exists()).expect("sleep");
    let dir = std::env::current_exe().expect("test binary").parent().expect("its directory").to_path_buf();
    let name = [&b"sl\xe9ep-"[..], std::process::id().to_string().as_bytes()].concat();
    let exe = dir.join(std::ffi::OsStr::from_bytes(&name));
    fs::copy(sleep, &exe).expect("copy sleep");
    let mut child = std::process::Command::new(&exe).arg("30").spawn().expect("run the copy");
    let pid = HostPid(child.id() as i32);
    // (spawn returns once the exec is under way: wait for the sleep.)
    for _ in 0..500 {
        if state(pid) == Some('S') {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }

    // Act
    let st = status(pid);
    let tty = tty_nr(pid);
    let group = tgid(pid);
    let facts = template_facts(pid, true);
    let cow = frames(pid, &|| ());
    let _ = child.kill();
    let _ = child.wait();
    let _ = fs::remove_file(&exe);

    // Assert
    let lossy = String::from_utf8_lossy(&name).into_owned();
    // (No pid namespace of its own: its pid there is the host's.)
    assert_eq!(st.expect("status").ns_pid, SandboxPid(pid.raw()));
    assert_eq!(tty.expect("tty_nr"), tty_nr(HostPid(std::process::id() as i32)).expect("tty_nr of this process"));
    assert_eq!(group.expect("tgid"), pid);
    let facts = facts.expect("template facts");
    assert_eq!(facts.comm, String::from_utf8_lossy(&name[..name.len().min(15)]));
    let path = format!("{}/{lossy}", dir.display());
    assert!(facts.maps.expect("maps").iter().any(|m| m.path.as_deref() == Some(path.as_str())), "{path} mapped");
    assert!(cow.is_ok());
}

#[test]
fn readers_of_this_process_give_what_it_knows_of_itself() {
    // Arrange
    let me = HostPid(std::process::id() as i32);

    // Act
    let st = status(me).expect("status");
    let maps = maps(me).expect("maps");
    let vdso = vdso_base(me).expect("vdso");

    // Assert
    // (No pid namespace of its own: its pid there is the host's.)
    assert_eq!(st.ns_pid, SandboxPid(me.raw()));
    assert_eq!(tgid(me).expect("tgid"), me);
    assert!(st.threads >= 1);
    assert!(maps.iter().any(|m| m.path.as_deref() == Some("[stack]")));
    assert_eq!(maps.iter().find(|m| m.path.as_deref() == Some("[vdso]")).map(|m| m.start), Some(vdso));
}

#[test]
fn epoll_watch_inodes_are_read_from_each_tfd_line() {
    // Arrange
    let text = fdinfo_text("epoll");

    // Act
    let inos = epoll_watch_inodes(text);

    // Assert: the fixture's three watches, with their files' inodes.
    assert_eq!(inos, vec![(13, 0x40e), (10, 0x196937), (18, 0x40e)]);
}

#[test]
fn dont_fork_mappings_are_found_by_their_vmflags() {
    let smaps = "\
131b1a00000-131b1a40000 rw-p 00000000 00:00 0 
Size:                256 kB
Rss:                 256 kB
VmFlags: rd wr mr mw me dc nr
7f3638003000-7f363803f000 rwxp 00000000 00:00 0 
Rss:                  20 kB
VmFlags: rd wr ex mr mw me nr
7f3657fd2000-7f3658000000 ---p 00000000 00:00 0 
VmFlags: mr mw me dc nr
7f365c979000-7f365c97d000 rw-s 00000000 00:01 1234                       /dev/shm/x
VmFlags: rd wr sh mr mw me ms dc
";
    assert_eq!(
        super::parse_dont_fork(smaps),
        vec![
            (0x131b1a00000, 0x131b1a40000, true),
            (0x7f3657fd2000, 0x7f3658000000, true),
            (0x7f365c979000, 0x7f365c97d000, false),
        ]
    );
}

#[test]
fn advice_of_mappings_is_read_from_their_vmflags() {
    use crate::model::Advice;
    let smaps = "\
7f1b00000000-7f1b06400000 rw-p 00000000 00:00 0 
Size:             102400 kB
VmFlags: rd wr mr mw me ac hg uw
7f1b06400000-7f1b06410000 rw-p 00000000 00:00 0 
VmFlags: rd wr mr mw me ac wf dd
7f1b06410000-7f1b06420000 r--p 00000000 fe:00 77                         /usr/lib/x.so
VmFlags: rd mr mw me rr
7f1b06420000-7f1b06430000 rw-p 00000000 00:00 0 
VmFlags: rd wr mr mw me ac
";
    assert_eq!(
        super::parse_advice(smaps),
        vec![
            ((0x7f1b00000000, 0x7f1b06400000), vec![Advice::HugePage]),
            ((0x7f1b06400000, 0x7f1b06410000), vec![Advice::WipeOnFork, Advice::DontDump]),
            ((0x7f1b06410000, 0x7f1b06420000), vec![Advice::Random]),
        ]
    );
}

#[test]
fn posix_timers_are_listed_with_their_signal_value_notification_and_clock() {
    let text = "ID: 8\nsignal: 10/0000000000001234\nnotify: signal/pid.11834\nClockID: 1\n\
ID: 7\nsignal: 12/0000000000000000\nnotify: signal/tid.11835\nClockID: 0\n\
ID: 2\nsignal: 0/0000000000000000\nnotify: none/pid.11834\nClockID: 1\n";
    assert_eq!(
        parse_posix_timers(text).expect("parsed"),
        vec![
            (8, 10, 0x1234, libc::SIGEV_SIGNAL, 11834, 1),
            (7, 12, 0, libc::SIGEV_SIGNAL | libc::SIGEV_THREAD_ID, 11835, 0),
            (2, 0, 0, libc::SIGEV_NONE, 11834, 1),
        ]
    );
    assert!(parse_posix_timers("signal: 10/0\n").is_err(), "a field before any ID");
    assert!(parse_posix_timers("ID: 1\nnotify: weird/pid.3\n").is_err());
}
