//! Work cut into steps whose exchanges overlap the next steps' kernels: every rank
//! queues a step's kernels on its stream, the step's exchange on its lane (a second
//! stream of its device) once those kernels are done, and the step's merge back on its
//! stream once the exchange is, behind the next step's kernels.

use cust::context::CurrentContext;
use cust::stream::{Stream, StreamFlags};

use super::GpuGroup;
use crate::driver::{Event, StreamHandle, cust_error};
use crate::error::Result;
use crate::gpu::Gpu;

/// The most steps a pipeline takes.
pub(crate) const MAX_STEPS: usize = 16;

/// A rank's second stream, on which its exchanges run beside its kernels, and the events
/// that order the two: for step `s`, `events[2 s]` marks the step's kernels done,
/// `events[2 s + 1]` its exchange. The stream has the device's greatest priority: the
/// exchange's kernels take the SMs as blocks of the running kernels finish, instead of
/// waiting behind all of their blocks (the next steps hang on the exchange).
pub(crate) struct Lane {
    events: Vec<Event>,
    stream: Stream,
}

impl Lane {
    /// A lane on `gpu`'s device, in its context.
    pub(crate) fn new(gpu: &Gpu) -> Result<Self> {
        gpu.bind()?;
        let priority = CurrentContext::get_stream_priority_range()
            .map_err(|e| cust_error("cuCtxGetStreamPriorityRange", e))?
            .greatest;
        let stream = Stream::new(StreamFlags::NON_BLOCKING, Some(priority))
            .map_err(|e| cust_error("cuStreamCreateWithPriority", e))?;
        let events = (0..2 * MAX_STEPS)
            .map(|_| Event::new(cust::sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .collect::<Result<_>>()?;
        Ok(Self { events, stream })
    }

    fn handle(&self) -> StreamHandle {
        StreamHandle(self.stream.as_inner())
    }
}

impl GpuGroup {
    /// Runs `steps` steps (1 to [`MAX_STEPS`]): `local(step)` queues the step's kernels
    /// on every rank's stream; `exchange(step, lanes)` its exchange on the lanes' streams
    /// (rank order), each after its rank's kernels of the step; `merge(step)` kernels on
    /// the ranks' streams after the step's exchange, queued behind the next step's
    /// kernels so that the exchange runs beside them. Every rank's stream ends behind
    /// every exchange: what follows on it, freeing memory the exchanges used included,
    /// comes after them. Events are reused from call to call: a wait takes an event's
    /// state when it is queued.
    pub(crate) fn pipeline(
        &self,
        steps: usize,
        mut local: impl FnMut(usize) -> Result<()>,
        mut exchange: impl FnMut(usize, &[StreamHandle]) -> Result<()>,
        mut merge: impl FnMut(usize) -> Result<()>,
    ) -> Result<()> {
        assert!((1..=MAX_STEPS).contains(&steps), "{steps} steps");
        let lanes: Vec<StreamHandle> = self.lanes.iter().map(Lane::handle).collect();
        for step in 0..=steps {
            if step < steps {
                local(step)?;
                for (gpu, lane) in self.gpus.iter().zip(&self.lanes) {
                    gpu.bind()?;
                    let done = &lane.events[2 * step];
                    done.record(gpu.stream()?)?;
                    lane.handle().wait(done)?;
                }
                exchange(step, &lanes)?;
                for (gpu, lane) in self.gpus.iter().zip(&self.lanes) {
                    gpu.bind()?;
                    lane.events[2 * step + 1].record(lane.handle())?;
                }
            }
            if step > 0 {
                for (gpu, lane) in self.gpus.iter().zip(&self.lanes) {
                    gpu.bind()?;
                    gpu.stream()?.wait(&lane.events[2 * (step - 1) + 1])?;
                }
                merge(step - 1)?;
            }
        }
        Ok(())
    }
}
