//! `leaseq export` and `leaseq import`: jobs as JSON lines (schema in `jsonl.rs`).

use leaseq::JobState;

use crate::args::{ExportArgs, ImportArgs};
use crate::fail::{Fail, Outcome};
use crate::files::{self, Missing, path_of};
use crate::jsonl::JobLine;
use crate::output::Out;

/// Jobs read per `Queue::jobs` call.
const PAGE_JOBS: usize = 1000;

/// The order states are exported in: ready first, in the order they would be dequeued, then
/// leased ones (written as ready, behind them), scheduled, dead.
const EXPORT_STATES: [JobState; 4] = [
    JobState::Ready,
    JobState::Leased,
    JobState::Scheduled,
    JobState::Dead,
];

/// `leaseq export`: every job of the selected queues, one JSON object per line.
pub fn export(a: &ExportArgs) -> Outcome {
    let queue = files::open(&a.file, Missing::Refuse)?;
    let path = path_of(&queue);
    let queues = files::selected(&queue, a.queue.queue.as_deref())?;
    let mut total = 0;
    for q in &queues {
        total += q.stats().map_err(|e| Fail::leaseq(path, e))?.total;
    }
    let bar = files::bar(Some(total), "exporting");
    let mut out = Out::new();
    let mut written = 0u64;
    for q in &queues {
        for state in EXPORT_STATES {
            let mut after = None;
            loop {
                let page = q
                    .jobs(state, after, PAGE_JOBS)
                    .map_err(|e| Fail::leaseq(path, e))?;
                for info in &page.jobs {
                    // A job gone between the page and this read is not exported.
                    let Some(payload) = q.payload(info.id).map_err(|e| Fail::leaseq(path, e))?
                    else {
                        continue;
                    };
                    out.json(&JobLine::from_info(q.name(), info, Some(&payload)))?;
                    written += 1;
                    bar.inc(1);
                }
                match page.next {
                    Some(next) => after = Some(next),
                    None => break,
                }
            }
        }
    }
    out.flush()?;
    bar.finish_and_clear();
    tracing::info!(jobs = written, "exported");
    Ok(())
}

pub fn import(_a: &ImportArgs) -> Outcome {
    Err(Fail::error("stub"))
}
