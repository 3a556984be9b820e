//! Per-step timing of the multi-kernel GPU codecs (`gpz`, `cuszi`) for benchmarks: when it is
//! on, a CUDA event is recorded on the codec's stream after each step, and the steps' times are
//! the differences between consecutive events.

use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaStream};

use crate::error::{Error, Result};

/// Events recorded after the steps of a codec's operations, each labelled with the step it ends
/// (`"start"` marks the beginning of an operation).
#[derive(Default)]
pub(crate) struct StepTimer {
    events: Option<Vec<(&'static str, CudaEvent)>>,
}

impl StepTimer {
    /// Start (`on`) or stop recording; either way the recorded events are dropped.
    pub(crate) fn set(&mut self, on: bool) {
        self.events = on.then(Vec::new);
    }

    /// Record the event that ends `step` on `stream` (nothing when off).
    pub(crate) fn mark(&mut self, stream: &Arc<CudaStream>, step: &'static str) -> Result<()> {
        if let Some(v) = self.events.as_mut() {
            let e = stream
                .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| Error::Gpu(format!("event: {e:?}")))?;
            v.push((step, e));
        }
        Ok(())
    }

    /// The milliseconds of each step recorded since the last call, (step, ms), each timed from
    /// the event before it; the recording goes on.
    pub(crate) fn take(&mut self) -> Result<Vec<(&'static str, f32)>> {
        let Some(v) = self.events.as_mut() else {
            return Ok(Vec::new());
        };
        let ev = std::mem::take(v);
        let mut out = Vec::new();
        for w in ev.windows(2) {
            if w[1].0 == "start" {
                continue;
            }
            let ms = w[0]
                .1
                .elapsed_ms(&w[1].1)
                .map_err(|e| Error::Gpu(format!("event: {e:?}")))?;
            out.push((w[1].0, ms));
        }
        Ok(out)
    }
}
