//! [`Records`]: small tables an operator writes while the service runs (overrides, timed bans),
//! shared by every process so that a change is heard by all and outlives restarts. The Redis
//! backend keeps each table in a hash and announces changes on its resets channel; the memory
//! backend keeps none.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::error::BackendError;

/// The future of a [`Records`] operation.
pub type RecordsFuture<T> = Pin<Box<dyn Future<Output = Result<T, BackendError>> + Send>>;

/// Told which table changed (`Some(name)`), or that any may have (`None`: the backend could not
/// hear changes for a while, so every table should be read again). Returns whether it still
/// listens: `false` once its layer is gone, and the backend forgets it.
pub type OnRecordsChange = Arc<dyn Fn(Option<&str>) -> bool + Send + Sync>;

/// Tables of text fields and values, shared by every process using the backend
/// ([`Backend::records`](crate::Backend::records)).
pub trait Records: Send + Sync + 'static {
    /// Sets `field` of table `table` to `value`, or removes it (`None`), and tells every process
    /// (this one included) that `table` changed.
    fn write(&self, table: &str, field: &str, value: Option<&str>) -> RecordsFuture<()>;

    /// Every field of table `table` with its value.
    fn read(&self, table: &str) -> RecordsFuture<Vec<(String, String)>>;

    /// Calls `on_change` whenever a table changes, in any process (see [`OnRecordsChange`]).
    fn on_change(&self, on_change: OnRecordsChange);

    /// Removes each of `fields` from table `table` whose value is still the one given (an ended
    /// timed ban, read a moment ago: a ban written again since is kept), without telling the other
    /// processes, as nothing in force changes. The default keeps them: they are only read again.
    fn remove_unchanged(&self, table: &str, fields: Vec<(String, String)>) -> RecordsFuture<()> {
        let _ = (table, fields);
        Box::pin(std::future::ready(Ok(())))
    }

    /// Drops what this process cached of decisions under the limits named `limits` (a deny cache,
    /// leased slices), without telling the other processes (each does it when it hears of the
    /// change): a key's override changed, so a refusal cached under its old quota no longer
    /// holds. Must not block; the default does nothing.
    fn forget_cached(&self, limits: &[&str]) {
        let _ = limits;
    }

    /// Whether these records live in this process only (nothing to read at start, no other
    /// process to hear). The default: no, they are shared.
    fn in_process(&self) -> bool {
        false
    }
}
