//! The background loops of a node, one file each: the timers (lease expiry, deadlines, schedule
//! fires: `timers`), retention (`pruner`), the dashboard's per-minute rows (`rollup`), webhook delivery (`deliveries`), and on PostgreSQL the
//! listener that hears other nodes' commits (`listener`) and the vacuumer that keeps the dispatch
//! index clean (`vacuum`). Every node runs its own; row locks make each due item handled by one
//! node at a time. The SQLite checkpointer is the store's (`starbridge_store::sqlite`).

pub mod deliveries;
pub(crate) mod listener;
pub mod pruner;
pub mod rollup;
pub mod timers;
pub(crate) mod vacuum;
