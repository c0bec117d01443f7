//! Per-op GPU timing (`bench --op-times`): an event recorded on the stream at every op
//! boundary, summed per op.

use cudarc::driver::sys as dsys;

use super::{dev_err, CudaDevice};
use crate::base::error::Result;

impl CudaDevice {
    /// Starts (or stops) timing ops on the GPU: from now on every `mark_op` records an event.
    pub fn time_ops(&mut self, on: bool) {
        self.op_marks = on.then(Vec::new);
    }

    /// An op boundary: the GPU time until the next boundary is charged to `op` (and `detail`,
    /// when not empty, such as the projection of a matmul).
    pub fn mark_op(&mut self, op: &str, detail: &str) {
        let Some(marks) = self.op_marks.as_mut() else {
            return;
        };
        let label = if detail.is_empty() {
            op.to_string()
        } else {
            format!("{op} {detail}")
        };
        // An event that cannot be recorded only loses this op's share of the timing.
        if let Ok(e) = self
            .stream
            .record_event(Some(dsys::CUevent_flags::CU_EVENT_DEFAULT))
        {
            marks.push((label, e));
        }
    }

    /// GPU milliseconds per op since `time_ops(true)`, in order of first appearance; the
    /// marks are cleared. Waits for the recorded work to finish.
    pub fn op_times(&mut self) -> Result<Vec<(String, f64)>> {
        let Some(marks) = self.op_marks.as_mut() else {
            return Ok(Vec::new());
        };
        let end = self
            .stream
            .record_event(Some(dsys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| dev_err(self.ordinal, format!("op timing: {e}")))?;
        let marks = std::mem::take(marks);
        let mut out: Vec<(String, f64)> = Vec::new();
        for (i, (op, e)) in marks.iter().enumerate() {
            let next = marks.get(i + 1).map_or(&end, |(_, n)| n);
            let ms = e
                .elapsed_ms(next)
                .map_err(|e| dev_err(self.ordinal, format!("op timing: {e}")))?;
            match out.iter_mut().find(|(o, _)| o == op) {
                Some((_, t)) => *t += ms as f64,
                None => out.push((op.clone(), ms as f64)),
            }
        }
        Ok(out)
    }
}
