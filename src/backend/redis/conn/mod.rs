//! Reaching Redis: one server's own reconnecting connection and the task that keeps it, a
//! Cluster's connection (started lazily or not) and its keeper, their one retry loop and backoff,
//! the one set-up after every connect, a Cluster's slot map and redirections.

pub(crate) mod backoff;
pub(crate) mod cluster_keeper;
pub(crate) mod cluster_nodes;
pub(crate) mod connection;
pub(crate) mod lazy_cluster;
pub(crate) mod reconnect;
pub(crate) mod redirect;
pub(crate) mod server;
pub(crate) mod set_up;
pub(crate) mod slot_watch;
