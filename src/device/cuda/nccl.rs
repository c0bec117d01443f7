//! NCCL, opened at run time. cudarc 0.19 has NCCL bindings, but its run-time loader asks for
//! `libnccl.so`, `libnccl.so.13`, `.12`, … `.1` and never `libnccl.so.2`, the name NCCL's
//! packages and PyTorch's `nvidia-nccl` wheel install (and the only one on the GPU machines),
//! so the few entry points vramscope needs are bound here, through the same search as the other
//! CUDA libraries (`loader.rs`), with an error that says which file was looked for where.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

use libloading::Library;

/// `ncclUniqueId`: 128 opaque bytes made by rank 0 and handed to every rank.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct UniqueId {
    pub internal: [c_char; 128],
}

pub(crate) type Comm = *mut c_void;
type Stream = *mut c_void;
type NcclResult = c_int;

/// `ncclDataType_t` values (nccl.h).
pub(crate) const NCCL_FLOAT16: c_int = 6;
pub(crate) const NCCL_FLOAT32: c_int = 7;
pub(crate) const NCCL_BFLOAT16: c_int = 9;
/// `ncclSum`.
const NCCL_SUM: c_int = 0;

struct Api {
    _lib: Library,
    path: String,
    get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> NcclResult,
    comm_init_rank: unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int) -> NcclResult,
    comm_destroy: unsafe extern "C" fn(Comm) -> NcclResult,
    all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        Comm,
        Stream,
    ) -> NcclResult,
    send: unsafe extern "C" fn(*const c_void, usize, c_int, c_int, Comm, Stream) -> NcclResult,
    recv: unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, Comm, Stream) -> NcclResult,
    group_start: unsafe extern "C" fn() -> NcclResult,
    group_end: unsafe extern "C" fn() -> NcclResult,
    error_string: unsafe extern "C" fn(NcclResult) -> *const c_char,
    version: unsafe extern "C" fn(*mut c_int) -> NcclResult,
}

// SAFETY: the table holds plain function pointers into a library that stays loaded for the
// life of the process; NCCL's entry points may be called from any thread.
unsafe impl Send for Api {}
unsafe impl Sync for Api {}

fn api() -> Result<&'static Api, String> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(|| {
        let path = super::loader::load_nccl()?;
        // SAFETY: loading NCCL runs its initialisers, which only set up its own state.
        let lib = unsafe { Library::new(&path) }
            .map_err(|e| format!("NCCL at {}: {e}", path.display()))?;
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol's type is nccl.h's prototype, written out above.
                *unsafe { lib.get($name) }.map_err(|e| {
                    format!(
                        "NCCL at {} lacks {}: {e}",
                        path.display(),
                        String::from_utf8_lossy(&$name[..$name.len() - 1])
                    )
                })?
            };
        }
        Ok(Api {
            get_unique_id: sym!(b"ncclGetUniqueId\0"),
            comm_init_rank: sym!(b"ncclCommInitRank\0"),
            comm_destroy: sym!(b"ncclCommDestroy\0"),
            all_reduce: sym!(b"ncclAllReduce\0"),
            send: sym!(b"ncclSend\0"),
            recv: sym!(b"ncclRecv\0"),
            group_start: sym!(b"ncclGroupStart\0"),
            group_end: sym!(b"ncclGroupEnd\0"),
            error_string: sym!(b"ncclGetErrorString\0"),
            version: sym!(b"ncclGetVersion\0"),
            path: path.display().to_string(),
            _lib: lib,
        })
    })
    .as_ref()
    .map_err(Clone::clone)
}

fn check(a: &Api, what: &str, r: NcclResult) -> Result<(), String> {
    if r == 0 {
        return Ok(());
    }
    // SAFETY: ncclGetErrorString returns a static C string for any result code.
    let msg = unsafe { CStr::from_ptr((a.error_string)(r)) }.to_string_lossy();
    Err(format!("NCCL {what}: {msg} (error {r})"))
}

/// NCCL's version as "2.28.9" and the file it came from.
pub(crate) fn version() -> Result<(String, String), String> {
    let a = api()?;
    let mut v: c_int = 0;
    // SAFETY: writes one int.
    check(a, "ncclGetVersion", unsafe { (a.version)(&mut v) })?;
    Ok((
        format!("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100),
        a.path.clone(),
    ))
}

pub(crate) fn unique_id() -> Result<UniqueId, String> {
    let a = api()?;
    let mut id = UniqueId { internal: [0; 128] };
    // SAFETY: writes the 128-byte id.
    check(a, "ncclGetUniqueId", unsafe { (a.get_unique_id)(&mut id) })?;
    Ok(id)
}

/// Joins communicator `id` as `rank` of `size` on the current CUDA device; blocks until every
/// rank has joined.
pub(crate) fn comm_init_rank(id: UniqueId, rank: usize, size: usize) -> Result<Comm, String> {
    let a = api()?;
    let mut comm: Comm = std::ptr::null_mut();
    // SAFETY: writes one handle; the id is passed by value as nccl.h declares.
    check(a, "ncclCommInitRank", unsafe {
        (a.comm_init_rank)(&mut comm, size as c_int, id, rank as c_int)
    })?;
    Ok(comm)
}

/// # Safety
/// `comm` came from `comm_init_rank` and is not used again.
pub(crate) unsafe fn comm_destroy(comm: Comm) {
    if let Ok(a) = api() {
        // SAFETY: per the caller's contract.
        let _ = unsafe { (a.comm_destroy)(comm) };
    }
}

/// Sum over the ranks of `count` elements from `send` into `recv` (the same pointer for in
/// place), queued on `stream`.
///
/// # Safety
/// Both pointers are live device buffers of `count` elements of `dtype` on the comm's device.
pub(crate) unsafe fn all_reduce_sum(
    send: u64,
    recv: u64,
    count: usize,
    dtype: c_int,
    comm: Comm,
    stream: *mut c_void,
) -> Result<(), String> {
    let a = api()?;
    check(a, "ncclAllReduce", unsafe {
        (a.all_reduce)(
            send as *const c_void,
            recv as *mut c_void,
            count,
            dtype,
            NCCL_SUM,
            comm,
            stream,
        )
    })
}

/// `torch.distributed.gather` as ProcessGroupNCCL runs it (torch/csrc/cuda/nccl.cpp `gather`):
/// one NCCL group in which the root receives from every rank (itself included) and the others
/// send. `recv` holds the root's destination buffers, one per rank, empty elsewhere.
///
/// # Safety
/// Every pointer is a live device buffer of `count` elements of `dtype`.
pub(crate) unsafe fn gather_to_first(
    send: u64,
    recv: &[u64],
    count: usize,
    dtype: c_int,
    rank: usize,
    comm: Comm,
    stream: *mut c_void,
) -> Result<(), String> {
    let a = api()?;
    check(a, "ncclGroupStart", unsafe { (a.group_start)() })?;
    let mut result = Ok(());
    if rank == 0 {
        for (peer, &dst) in recv.iter().enumerate() {
            let r = unsafe {
                (a.recv)(
                    dst as *mut c_void,
                    count,
                    dtype,
                    peer as c_int,
                    comm,
                    stream,
                )
            };
            result = result.and(check(a, "ncclRecv", r));
        }
    }
    let r = unsafe { (a.send)(send as *const c_void, count, dtype, 0, comm, stream) };
    result = result.and(check(a, "ncclSend", r));
    // The group must be closed whatever happened inside it.
    let end = check(a, "ncclGroupEnd", unsafe { (a.group_end)() });
    result.and(end)
}
