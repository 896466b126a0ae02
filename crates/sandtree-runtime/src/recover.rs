//! Start-up recovery after a daemon restart (clean or SIGKILL).
//!
//! For every sandbox row:
//! - its init still answers on its control socket → re-adopted, processes
//!   untouched;
//! - it should run but its init is gone (host reboot, crash) → started again
//!   from its filesystem state, with a status reason that says processes
//!   from before the restart were lost;
//! - it was stopped → left stopped.
//!
//! Then GC removes whatever a crash left half-made.

use sandtree_meta::DesiredState;

use crate::{Engine, Result};

pub(crate) const RESTARTED_REASON: &str =
    "restarted after a daemon restart: the filesystem is intact, processes from before the restart were lost";

impl Engine {
    pub(crate) async fn recover(&self) -> Result<()> {
        let host = self.cfg.host_config();
        for rec in self.meta.sandboxes()? {
            let adopted = match sandtree_sandbox::Sandbox::adopt(&host, &rec.id).await {
                Ok(sb) => sb,
                Err(e) => {
                    tracing::warn!(sandbox = rec.id, "cannot re-adopt, killing what is left of it: {e}");
                    if let Err(e) = sandtree_sandbox::Sandbox::destroy_stale(&host, &rec.id) {
                        tracing::warn!(sandbox = rec.id, "cannot clean up: {e}");
                    }
                    None
                }
            };
            match (adopted, rec.state) {
                (Some(sb), DesiredState::Running) => {
                    self.live_set(&rec.id, Some(std::sync::Arc::new(sb)));
                }
                (Some(sb), DesiredState::Stopped) => {
                    let _ = sb.kill().await;
                }
                (None, DesiredState::Running) => match self.boot(&rec).await {
                    Ok(_) => self.meta.set_sandbox_state(&rec.id, DesiredState::Running, Some(RESTARTED_REASON))?,
                    Err(e) => {
                        let reason = format!("could not be restarted after a daemon restart: {e}");
                        tracing::warn!(sandbox = rec.id, "{reason}");
                        self.meta.set_sandbox_state(&rec.id, DesiredState::Stopped, Some(&reason))?;
                    }
                },
                (None, DesiredState::Stopped) => {}
            }
        }
        let report = self.gc().await?;
        if !report.orphans_removed.is_empty() || !report.stale_runtime_removed.is_empty() {
            tracing::info!(
                orphans = ?report.orphans_removed,
                stale = ?report.stale_runtime_removed,
                "recovery removed leftovers of interrupted operations"
            );
        }
        Ok(())
    }
}
