//! NCCL, opened at run time: the library, its few entry points the device groups call,
//! and one communicator per device.
//!
//! The library is `NCCL_LIBRARY` when that is set, else the first of the usual names
//! the dynamic loader finds (`libnccl.so.2`, NCCL's runtime name, then `libnccl.so`).
//! Nothing links NCCL at build time, and a machine without it gets
//! [`Error::NcclUnavailable`] from [`GpuGroup::new`](super::GpuGroup::new), not a crash.
//! Result codes are read as plain integers, so a code newer than this file is an error
//! like the others.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;

use crate::driver::StreamHandle;
use crate::error::{Error, Result};

/// The names tried, in order, when `NCCL_LIBRARY` is not set.
const LIBRARY_NAMES: [&str; 2] = ["libnccl.so.2", "libnccl.so"];
/// `ncclUint8`: every exchange moves bytes; the sums are the kernels' own, in order.
const BYTES: c_int = 1;

/// An opaque `ncclComm_t`.
type RawComm = *mut c_void;

/// The entry points used, resolved once.
struct Nccl {
    /// Keeps the library mapped while the entry points below are in use.
    _library: libloading::Library,
    version: c_int,
    get_error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    comm_init_all: unsafe extern "C" fn(*mut RawComm, c_int, *const c_int) -> c_int,
    comm_destroy: unsafe extern "C" fn(RawComm) -> c_int,
    group_start: unsafe extern "C" fn() -> c_int,
    group_end: unsafe extern "C" fn() -> c_int,
    all_gather: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, RawComm, *mut c_void) -> c_int,
    broadcast:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, RawComm, *mut c_void) -> c_int,
    send: unsafe extern "C" fn(*const c_void, usize, c_int, c_int, RawComm, *mut c_void) -> c_int,
    recv: unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, RawComm, *mut c_void) -> c_int,
}

/// The process's NCCL, opened at the first call; the error of that attempt otherwise.
fn nccl() -> Result<&'static Nccl> {
    static NCCL: OnceLock<std::result::Result<Nccl, String>> = OnceLock::new();
    NCCL.get_or_init(open)
        .as_ref()
        .map_err(|detail| Error::NcclUnavailable {
            detail: detail.clone(),
        })
}

fn open() -> std::result::Result<Nccl, String> {
    let names: Vec<String> = match std::env::var("NCCL_LIBRARY") {
        Ok(path) if !path.is_empty() => vec![path],
        _ => LIBRARY_NAMES.iter().map(|name| name.to_string()).collect(),
    };
    let mut tried = Vec::new();
    // SAFETY: loading NCCL runs its initializers, which only set up the library's own
    // state.
    let library = names
        .iter()
        .find_map(|name| match unsafe { libloading::Library::new(name) } {
            Ok(library) => Some(library),
            Err(e) => {
                tried.push(format!("{name}: {e}"));
                None
            }
        })
        .ok_or_else(|| format!("the NCCL library could not be opened ({})", tried.join("; ")))?;
    macro_rules! symbol {
        ($name:literal) => {
            // SAFETY: the type is the NCCL 2 header's prototype of the symbol.
            *unsafe { library.get(concat!($name, "\0").as_bytes()) }
                .map_err(|e| format!("the NCCL library lacks {}: {e}", $name))?
        };
    }
    let get_version: unsafe extern "C" fn(*mut c_int) -> c_int = symbol!("ncclGetVersion");
    let mut version = 0;
    // SAFETY: `version` is a live int for the call to write.
    if unsafe { get_version(&mut version) } != 0 || version < 2_0000 {
        return Err(format!(
            "the NCCL library reports version code {version}; NCCL 2 is needed"
        ));
    }
    Ok(Nccl {
        version,
        get_error_string: symbol!("ncclGetErrorString"),
        comm_init_all: symbol!("ncclCommInitAll"),
        comm_destroy: symbol!("ncclCommDestroy"),
        group_start: symbol!("ncclGroupStart"),
        group_end: symbol!("ncclGroupEnd"),
        all_gather: symbol!("ncclAllGather"),
        broadcast: symbol!("ncclBroadcast"),
        send: symbol!("ncclSend"),
        recv: symbol!("ncclRecv"),
        _library: library,
    })
}

impl Nccl {
    fn check(&self, call: &'static str, code: c_int) -> Result<()> {
        if code == 0 {
            return Ok(());
        }
        // SAFETY: ncclGetErrorString returns a static string for any code.
        let message = unsafe { CStr::from_ptr((self.get_error_string)(code)) }
            .to_string_lossy()
            .into_owned();
        Err(Error::Nccl { call, code, message })
    }
}

/// The NCCL version as (major, minor, patch).
pub(crate) fn version() -> Result<(u32, u32, u32)> {
    Ok(decode_version(nccl()?.version))
}

/// NCCL's version code: `major * 10000 + minor * 100 + patch` since 2.9, `major * 1000
/// + minor * 100 + patch` before.
fn decode_version(code: c_int) -> (u32, u32, u32) {
    let code = code.max(0) as u32;
    if code >= 10_000 {
        (code / 10_000, code / 100 % 100, code % 100)
    } else {
        (code / 1000, code / 100 % 10, code % 100)
    }
}

/// One communicator per device of a group, rank `i` on the group's `i`-th device.
pub(crate) struct Communicators {
    nccl: &'static Nccl,
    comms: Vec<RawComm>,
}

// SAFETY: NCCL communicators may be used from any thread, one call at a time, which the
// group's `&mut`/`&` discipline (no `Sync`) ensures.
unsafe impl Send for Communicators {}

/// One device's part of a collective: its communicator's rank, its buffers and its
/// stream, the buffers being device memory of that rank's device.
pub(crate) struct Part {
    pub(crate) send: u64,
    pub(crate) receive: u64,
    pub(crate) stream: StreamHandle,
}

/// `bytes` bytes from `send` on rank `from` to `receive` on rank `to`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Transfer {
    pub(crate) from: usize,
    pub(crate) to: usize,
    pub(crate) send: u64,
    pub(crate) receive: u64,
    pub(crate) bytes: usize,
}

impl Communicators {
    /// Communicators over the devices with the given CUDA ordinals, in this process.
    pub(crate) fn new(ordinals: &[u32]) -> Result<Self> {
        let nccl = nccl()?;
        let devices: Vec<c_int> = ordinals.iter().map(|&o| o as c_int).collect();
        let mut comms = vec![std::ptr::null_mut(); devices.len()];
        // SAFETY: `comms` has room for one communicator per device of `devices`.
        nccl.check("ncclCommInitAll", unsafe {
            (nccl.comm_init_all)(comms.as_mut_ptr(), devices.len() as c_int, devices.as_ptr())
        })?;
        Ok(Self { nccl, comms })
    }

    /// Every rank gets every rank's `bytes` bytes, rank after rank: part `i` sends
    /// `bytes` from `send` and receives `bytes * ranks` at `receive`.
    ///
    /// # Safety
    /// Each part's buffers hold those bytes on its rank's device and stay live until
    /// the work queued on its stream is done; one part per rank, in rank order.
    pub(crate) unsafe fn all_gather(&self, bytes: usize, parts: &[Part]) -> Result<()> {
        self.grouped("ncclAllGather", parts, |comm, part| {
            // SAFETY: the caller's contract on the buffers and the stream.
            unsafe {
                (self.nccl.all_gather)(
                    part.send as *const c_void,
                    part.receive as *mut c_void,
                    bytes,
                    BYTES,
                    comm,
                    part.stream.0.cast(),
                )
            }
        })
    }

    /// Rank `root`'s `bytes` bytes at its `send` to every rank's `receive`.
    ///
    /// # Safety
    /// As [`Communicators::all_gather`], with `bytes` bytes at every `receive` (and at
    /// the root's `send`).
    pub(crate) unsafe fn broadcast(&self, root: usize, bytes: usize, parts: &[Part]) -> Result<()> {
        self.grouped("ncclBroadcast", parts, |comm, part| {
            // SAFETY: the caller's contract on the buffers and the stream.
            unsafe {
                (self.nccl.broadcast)(
                    part.send as *const c_void,
                    part.receive as *mut c_void,
                    bytes,
                    BYTES,
                    root as c_int,
                    comm,
                    part.stream.0.cast(),
                )
            }
        })
    }

    /// Each transfer's bytes from its sender to its receiver, the sender's half queued on
    /// `streams[from]`, the receiver's on `streams[to]`, all started as one.
    ///
    /// # Safety
    /// Each transfer's `send` holds `bytes` bytes on the sender's device, its `receive`
    /// as many on the receiver's, both live until the work queued on the rank's stream is
    /// done; `streams` has a stream per rank, in rank order.
    pub(crate) unsafe fn transfer(&self, transfers: &[Transfer], streams: &[StreamHandle]) -> Result<()> {
        assert_eq!(streams.len(), self.comms.len(), "one stream per rank");
        self.group(|| {
            transfers.iter().filter(|t| t.bytes > 0).try_for_each(|t| {
                // SAFETY: the caller's contract on the buffers and the streams.
                unsafe {
                    self.nccl.check(
                        "ncclSend",
                        (self.nccl.send)(
                            t.send as *const c_void,
                            t.bytes,
                            BYTES,
                            t.to as c_int,
                            self.comms[t.from],
                            streams[t.from].0.cast(),
                        ),
                    )?;
                    self.nccl.check(
                        "ncclRecv",
                        (self.nccl.recv)(
                            t.receive as *mut c_void,
                            t.bytes,
                            BYTES,
                            t.from as c_int,
                            self.comms[t.to],
                            streams[t.to].0.cast(),
                        ),
                    )
                }
            })
        })
    }

    /// Runs `f`, whose calls NCCL then starts as one (groups nest).
    pub(crate) fn group<R>(&self, f: impl FnOnce() -> Result<R>) -> Result<R> {
        // SAFETY: group calls take no arguments.
        self.nccl
            .check("ncclGroupStart", unsafe { (self.nccl.group_start)() })?;
        let result = f();
        // SAFETY: as above; it closes the group opened here.
        let ended = self
            .nccl
            .check("ncclGroupEnd", unsafe { (self.nccl.group_end)() });
        let result = result?;
        ended.map(|()| result)
    }

    /// Queues one call per rank inside a group, as one thread driving several devices
    /// must, and ends the group even when a call fails.
    fn grouped(
        &self,
        call: &'static str,
        parts: &[Part],
        each: impl Fn(RawComm, &Part) -> c_int,
    ) -> Result<()> {
        assert_eq!(parts.len(), self.comms.len(), "one part per rank");
        self.group(|| {
            self.comms
                .iter()
                .zip(parts)
                .try_for_each(|(&comm, part)| self.nccl.check(call, each(comm, part)))
        })
    }
}

impl Drop for Communicators {
    fn drop(&mut self) {
        for &comm in &self.comms {
            // SAFETY: each communicator was made by ncclCommInitAll and is destroyed once.
            let code = unsafe { (self.nccl.comm_destroy)(comm) };
            if let Err(e) = self.nccl.check("ncclCommDestroy", code) {
                log::warn!("{e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn version_codes_of_both_forms_decode() {
        assert_eq!(super::decode_version(22803), (2, 28, 3));
        assert_eq!(super::decode_version(2804), (2, 8, 4));
        assert_eq!(super::decode_version(0), (0, 0, 0));
    }
}
