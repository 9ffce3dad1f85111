//! Reaching Redis: one server's own connection and its keeper, a Cluster's and its keeper, their
//! retry loop and backoff, the set-up after every connect, a Cluster's slot map and redirections.

pub(crate) mod cluster_nodes;
pub(crate) mod connection;
pub(crate) mod lazy_cluster;
pub(crate) mod reconnect;
pub(crate) mod redirect;
pub(crate) mod server;
pub(crate) mod set_up;
pub(crate) mod slot_watch;
