//! Which template gets a standby next, and the standby forks under way
//! (`standby.rs`): one fork at a time, between operations.

use crate::standby::Forking;
use crate::stats::TestSwitches;
use crate::track::Trackings;
use crate::{HostPid, SandboxPid};

use super::Pool;

/// What [`Pool::tend_standbys`] did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum StandbyWork {
    /// Nothing to do.
    Idle,
    /// A fork is under way (poll again soon).
    Forking,
    /// A fork was started or collected.
    Worked,
}

impl Pool {
    /// Gives templates without a standby their standby, one fork at a time,
    /// without waiting for it: collects the fork under way if it is done, or
    /// starts one. Order: the templates tracked processes' next checkpoints
    /// start from first (`incremental.rs`), then those of large processes
    /// (`Template::large`), then by checkpoint, the most recently used first (the
    /// likeliest rollback target). While such a base
    /// template's pages are being written, no other fork starts (the base's,
    /// which the next checkpoint needs, would wait for it). The tracer calls it
    /// between operations.
    pub(crate) fn tend_standbys(
        &mut self,
        tracking: &Trackings,
        others_taken: &[SandboxPid],
        switches: &TestSwitches,
    ) -> StandbyWork {
        let st = self;
        let mut under_way = false;
        // (A test's: `TestSwitches::hold_standby_forks`.)
        let held: Vec<HostPid> = match switches.holding_standby_forks() {
            true => tracking.values().filter_map(|t| t.base.as_ref().map(|b| b.1)).collect(),
            false => Vec::new(),
        };
        for t in st.checkpoints.values_mut().flat_map(|c| c.templates.iter_mut()) {
            if t.forking.is_none() {
                continue;
            }
            if held.contains(&t.host) {
                under_way = true;
                continue;
            }
            match t.poll_standby() {
                Some(()) => return StandbyWork::Worked,
                None => under_way = true,
            }
        }
        if under_way {
            return StandbyWork::Forking;
        }
        let bases = st.base_hosts(tracking, switches);
        let writing =
            st.checkpoints.values().flat_map(|c| &c.templates).any(|t| t.to_write.is_some() && bases.contains(&t.host));
        let Some((ck, i)) = st
            .checkpoints
            .iter()
            .flat_map(|(ck, c)| c.templates.iter().enumerate().map(move |(i, t)| (ck, c.last_used, i, t)))
            .filter(|(.., t)| t.standby.is_none() && !t.no_standby && t.to_write.is_none() && t.scratch != 0)
            .filter(|(.., t)| !writing || bases.contains(&t.host))
            .max_by_key(|(_, used, _, t)| (bases.contains(&t.host), t.large(), *used))
            .map(|(ck, _, i, _)| (ck.clone(), i))
        else {
            return StandbyWork::Idle;
        };
        let taken: std::collections::HashSet<SandboxPid> = st.ns_pids().chain(others_taken.iter().copied()).collect();
        let next = &mut st.next_pool_pid;
        let Some(t) = st.checkpoints.get_mut(&ck).and_then(|c| c.templates.get_mut(i)) else {
            return StandbyWork::Idle;
        };
        let ns_pid = (!t.any_pid).then(|| pool_pid(next, &taken));
        // (Off the tracer's CPU for the fork: see `start`.)
        crate::inject::move_off_tracer(t.host);
        match t.start_standby(ns_pid) {
            Ok(()) => t.forking = Some(Forking::started(ns_pid, t.scratch, crate::inject::nice_of(t.host))),
            Err(e) => t.failed(e),
        }
        StandbyWork::Worked
    }

    /// The templates tracked processes' next checkpoints start from (host
    /// pids), and the ones before them (`incremental::OlderStandby`) whose standby is
    /// still to come: their standbys are the ones a checkpoint takes. (The
    /// one before whose standby a checkpoint took already is made again only
    /// when the last checkpoint was *behind*, `Tracking::behind`: else its
    /// fork would double the forks of large processes, and the base's, a
    /// 1 GB one's 10-20 ms, would wait for it.)
    fn base_hosts(&self, tracking: &Trackings, switches: &TestSwitches) -> Vec<HostPid> {
        let st = self;
        let taken = |id: &(String, HostPid)| st.template(id).is_none_or(|t| t.standby_taken);
        let prev = |t: &crate::track::Tracking| {
            let always = switches.preferring_older_standbys();
            t.prev.as_ref().filter(|(id, _)| always || t.behind || !taken(id)).map(|((_, host), _)| *host)
        };
        tracking.values().flat_map(|t| [t.base.as_ref().map(|b| b.1), prev(t)]).flatten().collect()
    }

    /// Standby forks under way run at [`crate::inject::BACKGROUND_NICE`] until the operation
    /// ends ([`Pool::forks_to_foreground`]): at a rollback every one it does not
    /// wait for, beside the restore's calls; at a checkpoint (`spare_bases`)
    /// all but the standbys of tracked processes' bases, which the checkpoint
    /// takes. (They run off the tracer's CPU, where every call of a restore or
    /// a capture is injected, from their start: `Template::start_standby`. A 1 GB fork there
    /// made a 0.3 ms restore take 3-6 ms.)
    pub(crate) fn forks_to_background(&self, tracking: &Trackings, switches: &TestSwitches, spare_bases: bool) {
        let st = self;
        let bases = if spare_bases { st.base_hosts(tracking, switches) } else { Vec::new() };
        for t in st.checkpoints.values().flat_map(|c| &c.templates) {
            if let Some(f) = &t.forking
                && f.nice().is_some()
                && !bases.contains(&t.host)
            {
                crate::inject::set_nice(t.host, crate::inject::BACKGROUND_NICE);
            }
        }
    }

    /// Standby forks under way get their template's nice value back (the
    /// operation that sent them to [`crate::inject::BACKGROUND_NICE`] is over: at that value
    /// the sandbox's own processes would starve them, and the forks after
    /// them wait).
    pub(crate) fn forks_to_foreground(&self) {
        let st = self;
        for t in st.checkpoints.values().flat_map(|c| &c.templates) {
            if let Some(n) = t.forking.as_ref().and_then(|f| f.nice()) {
                crate::inject::set_nice(t.host, n);
            }
        }
    }

    /// Every standby fork whose child's pid is not known yet ended (see
    /// [`crate::template::Template::settle_standby`]): a rollback's kill list must name every pool process.
    pub(crate) fn settle_anonymous(&mut self) {
        let st = self;
        for t in st.checkpoints.values_mut().flat_map(|c| c.templates.iter_mut()) {
            if t.forking.as_ref().is_some_and(|f| f.ns_pid().is_none()) {
                t.settle_standby();
            }
        }
    }
}

/// A pid for a standby: the highest free one below the last given (from
/// the top of the range, where the kernel, counting up from 1, gives pids
/// last), none of the pool's.
fn pool_pid(next: &mut SandboxPid, taken: &std::collections::HashSet<SandboxPid>) -> SandboxPid {
    let max = SandboxPid::max();
    let floor = max / 2;
    let next_raw = next.raw();
    let mut pid = if next_raw <= floor || next_raw >= max { max - 1 } else { next_raw };
    // (At most once round the upper half: a pool that held all of it would
    // get a taken pid, and its clone3 EEXIST.)
    for _ in floor..max {
        if !taken.contains(&SandboxPid(pid)) {
            break;
        }
        pid = if pid - 1 <= floor { max - 1 } else { pid - 1 };
    }
    *next = SandboxPid(pid - 1);
    SandboxPid(pid)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use crate::SandboxPid;

    #[test]
    fn standby_pids_count_down_from_the_top_and_skip_the_pools() {
        let max = SandboxPid::max();
        let pid = SandboxPid;
        let mut next = pid(0);
        let none = HashSet::new();
        assert_eq!(super::pool_pid(&mut next, &none), pid(max - 1));
        assert_eq!(super::pool_pid(&mut next, &none), pid(max - 2));
        let taken: HashSet<SandboxPid> = [pid(max - 3), pid(max - 4)].into();
        assert_eq!(super::pool_pid(&mut next, &taken), pid(max - 5));
        // Down to the middle of the range, then from the top again.
        next = pid(max / 2 + 1);
        assert_eq!(super::pool_pid(&mut next, &none), pid(max / 2 + 1));
        assert_eq!(super::pool_pid(&mut next, &none), pid(max - 1));
        let top: HashSet<SandboxPid> = [pid(max - 1)].into();
        next = pid(max / 2 + 1);
        super::pool_pid(&mut next, &none);
        assert_eq!(super::pool_pid(&mut next, &top), pid(max - 2));
    }
}
