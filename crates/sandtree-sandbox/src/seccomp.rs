//! The sandbox seccomp filter: `EPERM` for syscalls that touch host-global
//! kernel state or have a history of privilege escalation; everything else
//! (including `ptrace`, needed by later live checkpointing) is allowed.
//!
//! The filter is compiled once in the zygote with seccompiler and installed
//! by init (after `pivot_root`) without `PR_SET_NO_NEW_PRIVS`: init is root
//! in its user namespace, which the kernel accepts instead of NNP. It is
//! inherited by every process of the sandbox.

use std::collections::BTreeMap;

use nix::libc;
use sandtree_sys::process::BpfInsn;
use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// seccompiler rejected the filter.
    #[error("compile seccomp filter: {0}")]
    Compile(String),
    /// The kernel rejected the filter.
    #[error("install seccomp filter: {0}")]
    Install(#[from] sandtree_sys::process::Error),
}

/// Result alias of this module.
pub type Result<T> = std::result::Result<T, Error>;

/// Denied syscalls (x86_64 numbers).
pub const DENIED: &[(&str, i64)] = &[
    ("init_module", libc::SYS_init_module),
    ("finit_module", libc::SYS_finit_module),
    ("delete_module", libc::SYS_delete_module),
    ("kexec_load", libc::SYS_kexec_load),
    ("kexec_file_load", libc::SYS_kexec_file_load),
    ("bpf", libc::SYS_bpf),
    ("perf_event_open", libc::SYS_perf_event_open),
    ("keyctl", libc::SYS_keyctl),
    ("add_key", libc::SYS_add_key),
    ("request_key", libc::SYS_request_key),
    ("reboot", libc::SYS_reboot),
    ("swapon", libc::SYS_swapon),
    ("swapoff", libc::SYS_swapoff),
    ("acct", libc::SYS_acct),
    ("open_by_handle_at", libc::SYS_open_by_handle_at),
    ("iopl", libc::SYS_iopl),
    ("ioperm", libc::SYS_ioperm),
    ("syslog", libc::SYS_syslog),
    ("userfaultfd", libc::SYS_userfaultfd),
    ("lookup_dcookie", libc::SYS_lookup_dcookie),
    ("quotactl", libc::SYS_quotactl),
    ("nfsservctl", libc::SYS_nfsservctl),
    ("create_module", 174),
];

/// Compile the filter to classic BPF.
pub fn compile() -> Result<Vec<BpfInsn>> {
    let rules = DENIED.iter().map(|&(_, nr)| (nr, Vec::new())).collect::<BTreeMap<_, _>>();
    let filter =
        SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(libc::EPERM as u32), TargetArch::x86_64)
            .map_err(|e| Error::Compile(e.to_string()))?;
    let prog: BpfProgram = filter.try_into().map_err(|e: seccompiler::BackendError| Error::Compile(e.to_string()))?;
    Ok(prog.iter().map(|i| (i.code, i.jt, i.jf, i.k)).collect())
}

/// Install a compiled filter on the calling process.
pub fn install(prog: &[BpfInsn]) -> Result<()> {
    sandtree_sys::process::install_seccomp_filter(prog)?;
    Ok(())
}
