//! The E2B door: `sandtree daemon --e2b ADDR:PORT` serves E2B's control
//! plane and its in-sandbox agent's protocol (envd), so that programs
//! written for the official `e2b` SDK run against Sandtree unchanged, set up
//! by environment variables alone:
//!
//! ```text
//! E2B_API_URL=http://ADDR:PORT      the control plane (this listener)
//! E2B_SANDBOX_URL=http://ADDR:PORT  envd (the same listener: paths differ)
//! E2B_API_KEY=<the daemon's token>  (<data-dir>/token)
//! ```
//!
//! - **Control plane** ([`control`]): REST/JSON, authenticated by
//!   `X-API-KEY` (the daemon's token), errors `{"code": <status>,
//!   "message"}` with `Should-Retry: false`.
//! - **envd** ([`envd`]): `/health`, `/files`, and the Connect services
//!   `process.Process` and `filesystem.Filesystem` ([`connect`]). The SDK
//!   names the sandbox in the `E2b-Sandbox-Id` header; each request carries
//!   the sandbox's access token (`X-Access-Token`), which the create and
//!   connect answers gave: a hash of the daemon's token and the sandbox id,
//!   so it survives a restart and opens no other sandbox.
//!
//! Mapping: an E2B sandbox is a Sandtree sandbox (template `base`, or an
//! image name; a snapshot id — a checkpoint — makes a fork of it, with its
//! processes); metadata are labels; a snapshot is a checkpoint; `fork` is a
//! checkpoint and a fork; the timeout (default [`DEFAULT_TIMEOUT_S`]) ends
//! the sandbox (deleted, as E2B kills it; paused if it was made with
//! `autoPause`). Commands run as E2B runs them
//! (`/bin/bash -l -c`), as root unless the request names a user (E2B's
//! templates default to `user`; Sandtree's images have root). What E2B has
//! and Sandtree does not (template builds, volumes, network rules, MCP
//! gateways, auto-pause) is refused with a clear error.

pub mod connect;
pub mod control;
pub mod envd;
pub(crate) mod state;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::http::HeaderMap;
use sandtree_runtime::Engine;
use sha2::{Digest, Sha256};
use tokio::task::AbortHandle;

use self::state::{SavedMeta, StateDir};
use crate::daemon::auth::Token;

/// A sandbox's life when the create names no timeout (the SDK's own
/// default is 300 s; E2B's server says 15).
pub const DEFAULT_TIMEOUT_S: u64 = 300;
/// The envd version reported: the newest the SDK checks for (below it,
/// features are refused client-side). PEP 440.
pub const ENVD_VERSION: &str = "0.6.4";

/// What the door keeps of a sandbox it serves (all but the timer and the
/// processes it started are saved on disk: [`state`]).
#[derive(Default)]
pub(crate) struct SandboxMeta {
    pub template: Option<String>,
    pub started: Option<SystemTime>,
    pub end: Option<SystemTime>,
    /// Environment of every command (`envVars` at create).
    pub envs: BTreeMap<String, String>,
    /// The task that ends the sandbox at its timeout.
    pub timer: Option<AbortHandle>,
    /// The checkpoint a pause took (its resume rolls back to it).
    pub paused: Option<String>,
    /// The sandbox an `Idempotency-Key` made.
    pub idempotency_key: Option<String>,
    /// At the timeout, pause rather than delete (`autoPause`).
    pub auto_pause: bool,
    /// A paused sandbox resumes at its first envd request (`autoResume`).
    pub auto_resume: bool,
    /// The timeout last set (seconds): an auto-resume arms it again.
    pub timeout_s: Option<u64>,
    /// The last metrics' time and CPU used (µs): the next one's CPU share
    /// is since then.
    pub cpu_sample: Option<(SystemTime, u64)>,
    /// What is saved of it on disk now.
    saved: Option<SavedMeta>,
}

impl SandboxMeta {
    fn to_saved(&self) -> SavedMeta {
        SavedMeta {
            template: self.template.clone(),
            started_ms: self.started.map(state::to_ms),
            end_ms: self.end.map(state::to_ms),
            envs: self.envs.clone(),
            paused: self.paused.clone(),
            idempotency_key: self.idempotency_key.clone(),
            auto_pause: self.auto_pause,
            auto_resume: self.auto_resume,
            timeout_s: self.timeout_s,
            ..SavedMeta::new()
        }
    }

    fn from_saved(saved: SavedMeta) -> SandboxMeta {
        SandboxMeta {
            template: saved.template.clone(),
            started: saved.started_ms.map(state::from_ms),
            end: saved.end_ms.map(state::from_ms),
            envs: saved.envs.clone(),
            timer: None,
            paused: saved.paused.clone(),
            idempotency_key: saved.idempotency_key.clone(),
            auto_pause: saved.auto_pause,
            auto_resume: saved.auto_resume,
            timeout_s: saved.timeout_s,
            cpu_sample: None,
            saved: Some(saved),
        }
    }
}

/// The door's state, shared by its handlers.
pub struct E2b {
    pub(crate) engine: Arc<Engine>,
    pub(crate) token: Token,
    pub(crate) sandboxes: Mutex<HashMap<String, SandboxMeta>>,
    /// Where [`SandboxMeta`] is saved (`<data-dir>/e2b`).
    states: StateDir,
    /// Held by an auto-resume (one at a time: requests arriving together
    /// resume a sandbox once).
    pub(crate) resuming: tokio::sync::Mutex<()>,
    pub(crate) processes: envd::Processes,
    pub(crate) watchers: envd::Watchers,
}

impl E2b {
    /// The door, with what it saved of each sandbox before a restart read
    /// back: timeouts armed again for the time they had left (a sandbox
    /// whose end passed meanwhile is deleted, as its timeout would have
    /// deleted it), a paused sandbox still paused, its commands' envs.
    pub async fn open(engine: Arc<Engine>, token: Token) -> Arc<E2b> {
        let states = StateDir::new(engine.config().data_dir.join("e2b"));
        let saved = states.load_all();
        let door = Arc::new(E2b {
            engine,
            token,
            sandboxes: Mutex::default(),
            states,
            resuming: tokio::sync::Mutex::new(()),
            processes: envd::Processes::default(),
            watchers: envd::Watchers::default(),
        });
        for (id, saved) in saved {
            match door.engine.get_sandbox(&id).await {
                Err(sandtree_runtime::Error::SandboxNotFound(_)) => door.states.remove(&id),
                Err(e) => tracing::warn!(sandbox = %id, "the E2B door's state of the sandbox is kept unused: {e}"),
                Ok(_) => {
                    let end = saved.end_ms.map(state::from_ms);
                    door.sandboxes
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(id.clone(), SandboxMeta::from_saved(saved));
                    if let Some(end) = end {
                        door.arm_timeout_until(&id, end);
                    }
                }
            }
        }
        door
    }

    /// The envd access token of sandbox `id`.
    pub(crate) fn access_token(&self, id: &str) -> String {
        let mut h = Sha256::new();
        h.update(self.token.as_str().as_bytes());
        h.update(b"\0envd\0");
        h.update(id.as_bytes());
        h.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The sandbox whose access token signed a file URL (E2B's
    /// `download_url` / `upload_url`, which name no sandbox): `signature`
    /// is `v1_` and the unpadded base64 of the SHA-256 of
    /// `path:operation:user:token[:expiration]`, checked against every
    /// sandbox the door has given a token for.
    pub(crate) fn signed_by(
        &self,
        (path, operation, user): (&str, &str, &str),
        signature: &str,
        expiration: Option<&str>,
    ) -> Option<String> {
        use base64::Engine as _;
        let ids: Vec<String> = self.sandboxes.lock().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect();
        ids.into_iter().find(|id| {
            let token = self.access_token(id);
            let raw = match expiration {
                None => format!("{path}:{operation}:{user}:{token}"),
                Some(e) => format!("{path}:{operation}:{user}:{token}:{e}"),
            };
            let want = format!(
                "v1_{}",
                base64::engine::general_purpose::STANDARD_NO_PAD.encode(Sha256::digest(raw.as_bytes()))
            );
            crate::daemon::auth::constant_time_eq(signature.as_bytes(), want.as_bytes())
        })
    }

    /// `f` on the door's state of sandbox `id`, saved on disk when it changed.
    pub(crate) fn meta<T>(&self, id: &str, f: impl FnOnce(&mut SandboxMeta) -> T) -> T {
        let mut map = self.sandboxes.lock().unwrap_or_else(|p| p.into_inner());
        let m = map.entry(id.to_string()).or_default();
        let out = f(m);
        let now = m.to_saved();
        if m.saved.as_ref().unwrap_or(&SavedMeta::new()) != &now {
            if let Err(e) = self.states.save(id, &now) {
                tracing::warn!(sandbox = %id, "the E2B door's state of the sandbox could not be saved (a restart would lose it): {e}");
            }
            m.saved = Some(now);
        }
        out
    }

    pub(crate) fn is_paused(&self, id: &str) -> bool {
        self.sandboxes.lock().unwrap_or_else(|p| p.into_inner()).get(id).is_some_and(|m| m.paused.is_some())
    }

    /// Stops sandbox `id`'s timeout (a paused sandbox is kept).
    pub(crate) fn disarm_timeout(&self, id: &str) {
        if let Some(timer) = self.meta(id, |m| m.timer.take()) {
            timer.abort();
        }
    }

    pub(crate) fn forget(&self, id: &str) {
        let meta = self.sandboxes.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
        if let Some(timer) = meta.and_then(|m| m.timer) {
            timer.abort();
        }
        self.states.remove(id);
        self.processes.forget_sandbox(id);
        self.watchers.forget_sandbox(id);
    }

    /// (Re)arms sandbox `id`'s timeout: `secs` from now it is deleted.
    pub(crate) fn arm_timeout(self: &Arc<Self>, id: &str, secs: u64) {
        self.meta(id, |m| m.timeout_s = Some(secs));
        self.arm_timeout_until(id, SystemTime::now() + Duration::from_secs(secs));
    }

    /// (Re)arms sandbox `id`'s timeout: at `end` it is deleted (at once if
    /// `end` has passed).
    fn arm_timeout_until(self: &Arc<Self>, id: &str, end: SystemTime) {
        let left = end.duration_since(SystemTime::now()).unwrap_or_default();
        let door = self.clone();
        let sid = id.to_string();
        let timer = tokio::spawn(async move {
            tokio::time::sleep(left).await;
            // (This task's own handle is dropped, not aborted: the pause
            // below disarms the timeout, which would cut it short.)
            let auto_pause = door.meta(&sid, |m| {
                m.timer.take();
                m.auto_pause
            });
            if auto_pause {
                control::pause_at_timeout(&door, &sid).await;
                return;
            }
            tracing::info!(sandbox = %sid, "E2B timeout reached: deleting the sandbox");
            let _ = door.engine.delete_sandbox(&sid, false).await;
            door.forget(&sid);
        })
        .abort_handle();
        let old = self.meta(id, |m| {
            m.end = Some(end);
            m.started.get_or_insert_with(SystemTime::now);
            m.timer.replace(timer)
        });
        if let Some(old) = old {
            old.abort();
        }
    }
}

/// The value of header `name`, as text.
pub(crate) fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// The door's router: the control plane and envd on one listener (any
/// other path: a JSON 404, which the SDK can parse).
pub fn router(door: Arc<E2b>) -> Router {
    control::routes().merge(envd::routes()).fallback(control::not_served).with_state(door)
}
