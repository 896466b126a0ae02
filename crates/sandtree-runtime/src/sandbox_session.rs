//! Persistent shell sessions (pty-backed bash that keeps cwd, env and
//! variables between calls).

use std::time::{Duration, Instant, UNIX_EPOCH};

use sandtree_api::{
    CreateSessionRequest, OutputEncoding, SessionInfo, SessionList, SessionRunRequest, SessionRunResponse,
};
use sandtree_sandbox::session::{SessionId, SessionOptions};

use crate::{Engine, Error, Result, encode_output, util};

fn session_info(sandbox: &str, s: &sandtree_sandbox::session::SessionInfo) -> SessionInfo {
    SessionInfo {
        id: s.id.0.clone(),
        sandbox_id: sandbox.to_string(),
        pid: s.pid,
        shell: "/bin/bash".into(),
        created_at: util::rfc3339(UNIX_EPOCH + Duration::from_secs(s.started_at)),
        running: true,
    }
}

impl Engine {
    pub async fn create_session(&self, id: &str, req: CreateSessionRequest) -> Result<SessionInfo> {
        self.record(id)?;
        let sb = self.running(id).await?;
        let opts = SessionOptions {
            user: crate::sandbox_exec::user_name(req.user.as_deref())?,
            cwd: req.cwd,
            env: req.env.into_iter().collect(),
            cols: req.cols.unwrap_or(120),
            rows: req.rows.unwrap_or(40),
        };
        let sid = sb.open_session(opts).await?;
        sb.sessions()
            .iter()
            .find(|s| s.id == sid)
            .map(|s| session_info(id, s))
            .ok_or_else(|| Error::Internal("session vanished right after it was opened".into()))
    }

    pub async fn list_sessions(&self, id: &str) -> Result<SessionList> {
        self.record(id)?;
        let sessions = match self.live_get(id) {
            Some(sb) => sb.sessions().iter().map(|s| session_info(id, s)).collect(),
            None => Vec::new(),
        };
        Ok(SessionList { sessions })
    }

    fn session_of(&self, id: &str, sid: &str) -> Result<(std::sync::Arc<sandtree_sandbox::Sandbox>, SessionId)> {
        self.record(id)?;
        let missing = || Error::SessionNotFound(sid.to_string(), id.to_string());
        let sb = self.live_get(id).ok_or_else(missing)?;
        let s = sb.sessions().into_iter().find(|s| s.id.0 == sid).ok_or_else(missing)?;
        Ok((sb, s.id))
    }

    pub async fn session_run(&self, id: &str, sid: &str, req: SessionRunRequest) -> Result<SessionRunResponse> {
        self.session_run_as(id, sid, req, OutputEncoding::Utf8).await
    }

    /// [`Engine::session_run`] with the output in `encoding`.
    pub async fn session_run_as(
        &self,
        id: &str,
        sid: &str,
        req: SessionRunRequest,
        encoding: OutputEncoding,
    ) -> Result<SessionRunResponse> {
        let (sb, sid) = self.session_of(id, sid)?;
        let t0 = Instant::now();
        let out = sb.session_run(&sid, &req.command, req.timeout_ms.map(Duration::from_millis)).await;
        self.flusher.poke();
        let out = out?;
        Ok(SessionRunResponse {
            output: encode_output(&out.output, encoding),
            exit_code: out.exit_code,
            timed_out: out.timed_out,
            duration_ms: util::ms_since(t0),
        })
    }

    /// The pty of a session, for interactive attach (websocket).
    pub async fn session_io(&self, id: &str, sid: &str) -> Result<sandtree_sandbox::session::SessionIo> {
        let (sb, sid) = self.session_of(id, sid)?;
        Ok(sb.session_io(&sid)?)
    }

    /// How a session's shell ended, once it has: its exit code, or the
    /// signal that killed it (the first caller gets it).
    pub async fn session_exit(&self, id: &str, sid: &str) -> Result<(Option<i32>, Option<i32>)> {
        let (sb, sid) = self.session_of(id, sid)?;
        let exit = sb.session_exit(&sid).await?;
        Ok((exit.code, exit.signal))
    }

    pub async fn close_session(&self, id: &str, sid: &str) -> Result<()> {
        let (sb, sid) = self.session_of(id, sid)?;
        sb.close_session(&sid).await?;
        Ok(())
    }
}
