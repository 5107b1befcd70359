//! How the ranks of a group exchange data: NCCL, or, for ranks that share one device
//! (a group made to test the group's logic on a machine with one GPU), device copies
//! ordered between the ranks' streams by events.

use super::nccl::{Communicators, Part, Transfer};
use crate::driver::{self, Event, StreamHandle};
use crate::error::Result;

pub(crate) enum Exchange {
    Nccl(Communicators),
    OneDevice,
}

impl Exchange {
    /// Runs `f`, whose exchanges start as one.
    pub(crate) fn group<R>(&self, f: impl FnOnce() -> Result<R>) -> Result<R> {
        match self {
            Self::Nccl(comms) => comms.group(f),
            Self::OneDevice => f(),
        }
    }

    /// Every rank gets every rank's `bytes` bytes, rank after rank.
    ///
    /// # Safety
    /// As [`Communicators::all_gather`].
    pub(crate) unsafe fn all_gather(&self, bytes: usize, parts: &[Part]) -> Result<()> {
        match self {
            // SAFETY: the caller's contract.
            Self::Nccl(comms) => unsafe { comms.all_gather(bytes, parts) },
            Self::OneDevice => {
                let sources: Vec<usize> = (0..parts.len()).collect();
                // SAFETY: the caller's contract, the same as the copies'.
                unsafe {
                    copy_between(parts, &sources, bytes, |to, from| {
                        (parts[from].send, to.receive + (from * bytes) as u64)
                    })
                }
            }
        }
    }

    /// Rank `root`'s `bytes` bytes to every rank.
    ///
    /// # Safety
    /// As [`Communicators::broadcast`].
    pub(crate) unsafe fn broadcast(&self, root: usize, bytes: usize, parts: &[Part]) -> Result<()> {
        match self {
            // SAFETY: the caller's contract.
            Self::Nccl(comms) => unsafe { comms.broadcast(root, bytes, parts) },
            // SAFETY: the caller's contract, the same as the copies'.
            Self::OneDevice => unsafe {
                copy_between(parts, &[root], bytes, |to, _| (parts[root].send, to.receive))
            },
        }
    }

    /// Each transfer's bytes from its sender to its receiver, on the ranks' `streams`.
    ///
    /// # Safety
    /// As [`Communicators::transfer`].
    pub(crate) unsafe fn transfer(&self, transfers: &[Transfer], streams: &[StreamHandle]) -> Result<()> {
        match self {
            // SAFETY: the caller's contract.
            Self::Nccl(comms) => unsafe { comms.transfer(transfers, streams) },
            Self::OneDevice => {
                for t in transfers.iter().filter(|t| t.bytes > 0) {
                    let (from, to) = (streams[t.from], streams[t.to]);
                    let sent = event()?;
                    sent.record(from)?;
                    to.wait(&sent)?;
                    // SAFETY: the caller's contract on the ranges; one row of `bytes`
                    // bytes, after the sender's work and before the sender's next.
                    unsafe {
                        driver::copy_rows_async((t.send, t.bytes), (t.receive, t.bytes), t.bytes, 1, to)?
                    };
                    let received = event()?;
                    received.record(to)?;
                    from.wait(&received)?;
                }
                Ok(())
            }
        }
    }
}

fn event() -> Result<Event> {
    Event::new(cust::sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
}

/// On every rank's stream, after the `sources`' streams reach this point, copies
/// `bytes` bytes from and to the addresses `at(rank's part, source)` gives; the
/// sources' streams then wait for the copies, as they would for a collective.
///
/// # Safety
/// Every range named is live device memory of the one device until the copies are done.
unsafe fn copy_between(
    parts: &[Part],
    sources: &[usize],
    bytes: usize,
    at: impl Fn(&Part, usize) -> (u64, u64),
) -> Result<()> {
    let ready = sources
        .iter()
        .map(|&s| {
            let e = event()?;
            e.record(parts[s].stream)?;
            Ok(e)
        })
        .collect::<Result<Vec<_>>>()?;
    let mut done = Vec::with_capacity(parts.len());
    for part in parts {
        ready.iter().try_for_each(|e| part.stream.wait(e))?;
        for &source in sources {
            let (from, to) = at(part, source);
            // SAFETY: the caller's contract on the ranges; one row of `bytes` bytes.
            unsafe { driver::copy_rows_async((from, bytes), (to, bytes), bytes, 1, part.stream)? };
        }
        let e = event()?;
        e.record(part.stream)?;
        done.push(e);
    }
    for &source in sources {
        done.iter().try_for_each(|e| parts[source].stream.wait(e))?;
    }
    Ok(())
}
