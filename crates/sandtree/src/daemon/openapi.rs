//! The OpenAPI 3 document, generated from the wire types (`sandtree-api`)
//! and the `#[utoipa::path]` attributes of the handlers in [`super::routes`].
//!
//! `sandtree openapi` prints it; `openapi.json` at the repository root is the
//! checked-in copy (a test fails when it is stale); the daemon serves it at
//! `GET /v1/openapi.json`.

use sandtree_api::*;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::routes;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Sandtree API",
        description = "Sandboxes for AI agents with millisecond checkpoint, rollback and fork.\n\n\
            Served over HTTP/1.1 on the daemon's unix socket (no authentication; the socket is mode 0600) \
            and optionally on TCP, where every request needs `Authorization: Bearer <token>` \
            (the token is in `<data-dir>/token`).\n\n\
            Errors are `{\"error\": {\"code\": \"...\", \"message\": \"...\"}}` with a stable snake_case code.\n\n\
            Streams (`POST /v1/sandboxes/{id}/exec?stream=true`, `POST /v1/images`) are `application/x-ndjson`: \
            one JSON event per line, tagged by `type`.\n\n\
            Bytes: output is lossy UTF-8 text unless `?encoding=base64` asks for the exact bytes; stdin is \
            `stdin` (text) or `stdin_base64` in a JSON body (at most 64 MiB), or streams in a \
            `Content-Type: application/vnd.sandtree.exec+stdin` body of any length.",
        license(name = "Apache-2.0"),
    ),
    paths(
        routes::info, routes::openapi_json, routes::gc,
        routes::create_sandbox, routes::list_sandboxes, routes::get_sandbox, routes::delete_sandbox,
        routes::start_sandbox, routes::stop_sandbox, routes::get_network, routes::set_network, routes::expose_port, routes::list_ports, routes::close_port, routes::connect_port,
        routes::exec, routes::list_processes, routes::process_output, routes::kill_process,
        routes::read_file, routes::write_file, routes::remove_file, routes::stat_file, routes::list_files,
        routes::make_dir, routes::move_file,
        routes::create_session, routes::list_sessions, routes::session_run, routes::close_session, routes::attach_session,
        routes::create_checkpoint, routes::sandbox_checkpoints, routes::rollback,
        routes::list_checkpoints, routes::get_checkpoint, routes::checkpoint_image, routes::delete_checkpoint, routes::fork,
        routes::list_images, routes::import_image, routes::delete_image,
    ),
    components(schemas(
        ErrorBody, ApiError, ErrorCode,
        DaemonInfo, VolumeInfo, GcReport,
        Limits, Usage, SandboxStatus, SandboxInfo, NetworkMode, NetworkPolicy, NetworkSpec, NetworkInfo, ExposePortRequest, PortInfo, PortList, CreateSandboxRequest, CreateSandboxResponse, SandboxList, DeleteSandboxResponse, KeptCheckpoint,
        ExecRequest, ExecResponse, ExecEvent, OutputEncoding, ProcessInfo, ProcessList, ProcessOutput,
        FileKind, FileInfo, FileList, MakeDirRequest, MoveRequest,
        CreateSessionRequest, SessionInfo, SessionList, SessionRunRequest, SessionRunResponse,
        ProcessState, UnrestorableProcess, ImageState, ProcessImageInfo, CheckpointRequest, CheckpointInfo, CheckpointResponse, CheckpointList,
        RollbackRequest, RollbackResponse, ForkRequest, ForkResult, ForkResponse, DeleteCheckpointResponse,
        ImageInfo, ImageList, ImportImageRequest, ImportEvent,
    )),
    modifiers(&BearerAuth),
    security((), ("bearer" = [])),
    tags(
        (name = "daemon", description = "Daemon information and maintenance"),
        (name = "sandboxes", description = "Sandbox lifecycle"),
        (name = "exec", description = "Running commands"),
        (name = "files", description = "Reading and writing a sandbox's files"),
        (name = "sessions", description = "Persistent interactive shells"),
        (name = "checkpoints", description = "Checkpoint, rollback and fork"),
        (name = "images", description = "Root filesystems"),
    ),
)]
pub struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        let mut http = Http::new(HttpAuthScheme::Bearer);
        http.description = Some("Needed on the TCP listener only; the token is in `<data-dir>/token`.".into());
        components.add_security_scheme("bearer", SecurityScheme::Http(http));
    }
}

/// The document as a value.
pub fn document() -> utoipa::openapi::OpenApi {
    let mut doc = ApiDoc::openapi();
    doc.info.version = env!("CARGO_PKG_VERSION").to_string();
    doc
}

/// The document as pretty JSON with a trailing newline (the form of `openapi.json`).
pub fn document_json() -> String {
    let mut s = document().to_pretty_json().expect("the OpenAPI document serialises");
    s.push('\n');
    s
}
