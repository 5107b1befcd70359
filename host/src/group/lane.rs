//! A second stream per device, on which exchanges run beside the device's kernels.

use cust::context::CurrentContext;

use super::GpuGroup;
use crate::driver::{Event, OwnedStream, StreamHandle, cust_error};
use crate::error::Result;
use crate::gpu::Gpu;

/// A rank's second stream and the events that order it with the rank's stream, one per
/// hand-over of a call. The stream has the device's greatest priority: an exchange's
/// kernels take the SMs as blocks of the running kernels finish, instead of waiting
/// behind all of their blocks.
pub(crate) struct Lane {
    events: Vec<Event>,
    stream: OwnedStream,
}

impl Lane {
    /// A lane on `gpu`'s device with `events` events.
    pub(crate) fn new(gpu: &Gpu, events: usize) -> Result<Self> {
        gpu.bind()?;
        let priority = CurrentContext::get_stream_priority_range()
            .map_err(|e| cust_error("cuCtxGetStreamPriorityRange", e))?
            .greatest;
        let stream = OwnedStream::new(priority)?;
        let events = (0..events)
            .map(|_| Event::new(cust::sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .collect::<Result<_>>()?;
        Ok(Self { events, stream })
    }

    fn handle(&self) -> StreamHandle {
        self.stream.handle()
    }

    /// Makes what is queued on the lane from now on wait for the work queued so far on
    /// `gpu`'s stream (through event `event`). Events are reused from call to call: a
    /// wait takes an event's state when it is queued.
    pub(crate) fn follow(&self, gpu: &Gpu, event: usize) -> Result<()> {
        gpu.bind()?;
        self.events[event].record(gpu.stream()?)?;
        self.handle().wait(&self.events[event])
    }

    /// Makes what is queued on `gpu`'s stream from now on wait for the work queued so
    /// far on the lane (through event `event`).
    pub(crate) fn join(&self, gpu: &Gpu, event: usize) -> Result<()> {
        gpu.bind()?;
        self.events[event].record(self.handle())?;
        gpu.stream()?.wait(&self.events[event])
    }
}

impl GpuGroup {
    /// Every rank's lane stream, in rank order.
    pub(crate) fn lane_streams(&self) -> Vec<StreamHandle> {
        self.lanes.iter().map(Lane::handle).collect()
    }
}
