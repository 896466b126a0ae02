//! What the process engine counts, and the switches that tests use to
//! force paths the engine otherwise takes only by timing. One
//! [`Instruments`] is shared (`Arc`) by the tracers of one engine, given
//! to each at [`crate::Tracer::start`]: nothing here is process-wide.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

/// The engine's counters and test switches.
#[derive(Debug, Default)]
pub struct Instruments {
    counters: [AtomicU64; Counter::COUNT],
    /// Switches for tests.
    pub switches: TestSwitches,
}

/// What the engine counts.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Counter {
    /// Templates made from the previous template's standby of a process
    /// that ran no code since (`incremental.rs`'s quiet path).
    QuietTemplates,
    /// Templates of tracked processes made from the standby of the
    /// template before the previous one (`incremental::OlderStandby`).
    FromOlderStandbys,
    /// Templates made from a standby whose fork was still under way when
    /// their checkpoint took it (`incremental::ForkingStandby`).
    FromForksUnderWay,
    /// Pages copied by holders in the frozen window
    /// (`memory_holder::Copier`).
    PagesCopiedByHolders,
    /// Layered checkpoints whose processes but the largest moved to the
    /// staged tree while the largest one was copied.
    MovedEarly,
}

impl Counter {
    const COUNT: usize = 5;
}

/// The counters at one moment, since the engine started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessStats {
    /// Templates made from the previous template's standby of a process
    /// that ran no code since.
    pub quiet_templates: u64,
    /// Templates of tracked processes made from the standby of the
    /// template before the previous one.
    pub templates_from_older_standbys: u64,
    /// Templates made from a standby whose fork was still under way when
    /// their checkpoint took it (the frozen window did not wait for it).
    pub templates_from_forks_under_way: u64,
    /// Pages copied by holders in the frozen window.
    pub pages_copied_by_holders: u64,
    /// Layered checkpoints whose processes but the largest moved to the
    /// new tree while the largest one was copied.
    pub moved_early: u64,
}

impl Instruments {
    /// Add `n` to `counter`.
    pub(crate) fn count(&self, counter: Counter, n: u64) {
        self.counters[counter as usize].fetch_add(n, Ordering::Relaxed);
    }

    /// The counters now.
    pub fn stats(&self) -> ProcessStats {
        let get = |c: Counter| self.counters[c as usize].load(Ordering::Relaxed);
        ProcessStats {
            quiet_templates: get(Counter::QuietTemplates),
            templates_from_older_standbys: get(Counter::FromOlderStandbys),
            templates_from_forks_under_way: get(Counter::FromForksUnderWay),
            pages_copied_by_holders: get(Counter::PagesCopiedByHolders),
            moved_early: get(Counter::MovedEarly),
        }
    }
}

/// Switches that force rare paths, for tests. All off by default.
#[derive(Debug, Default)]
pub struct TestSwitches {
    hold_standby_forks: AtomicBool,
    prefer_older_standbys: AtomicBool,
    lose_next_standby_taken_while_forking: AtomicBool,
}

impl TestSwitches {
    /// The standby fork of a template a tracked process's next checkpoint
    /// starts from is not collected between operations, even once it is
    /// done, and the checkpoint takes it as if it were still under way
    /// (`incremental::ForkingStandby`): the path then does not hang on the
    /// timing of forks.
    pub fn hold_standby_forks(&self, on: bool) {
        self.hold_standby_forks.store(on, Ordering::Relaxed);
    }

    /// Whether standby forks are held ([`TestSwitches::hold_standby_forks`]):
    /// no checkpoint's image can be written meanwhile (its templates are
    /// not finished).
    pub fn standby_forks_held(&self) -> bool {
        self.hold_standby_forks.load(Ordering::Relaxed)
    }

    /// Every checkpoint of a tracked process starts from the standby of
    /// the template before the previous one whenever it is ready
    /// (`incremental::OlderStandby`), whatever the process's size.
    pub fn prefer_older_standbys(&self, on: bool) {
        self.prefer_older_standbys.store(on, Ordering::Relaxed);
    }

    /// The next standby a checkpoint takes while it is still being forked
    /// dies once its fork ends, after the checkpoint's reply, as one whose
    /// fork failed would: the checkpoint's templates are dropped (it shows
    /// as evicted), the template that stood in for it is not (`false`: no
    /// longer, if none was taken).
    pub fn lose_next_standby_taken_while_forking(&self, on: bool) {
        self.lose_next_standby_taken_while_forking.store(on, Ordering::Relaxed);
    }

    pub(crate) fn holding_standby_forks(&self) -> bool {
        self.hold_standby_forks.load(Ordering::Relaxed)
    }

    pub(crate) fn preferring_older_standbys(&self) -> bool {
        self.prefer_older_standbys.load(Ordering::Relaxed)
    }

    /// Whether to lose this standby (once: the switch turns off).
    pub(crate) fn take_lose_next_standby(&self) -> bool {
        self.lose_next_standby_taken_while_forking.swap(false, Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_add_up_each_to_its_own_field() {
        let i = Instruments::default();
        i.count(Counter::QuietTemplates, 1);
        i.count(Counter::PagesCopiedByHolders, 512);
        i.count(Counter::PagesCopiedByHolders, 3);
        i.count(Counter::MovedEarly, 2);
        let s = i.stats();
        assert_eq!(s.quiet_templates, 1);
        assert_eq!(s.pages_copied_by_holders, 515);
        assert_eq!(s.moved_early, 2);
        assert_eq!((s.templates_from_older_standbys, s.templates_from_forks_under_way), (0, 0));
    }

    #[test]
    fn losing_the_next_standby_happens_once() {
        let s = TestSwitches::default();
        assert!(!s.take_lose_next_standby());
        s.lose_next_standby_taken_while_forking(true);
        assert!(s.take_lose_next_standby());
        assert!(!s.take_lose_next_standby());
    }
}
