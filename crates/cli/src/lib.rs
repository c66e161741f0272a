//! The commands of the `sidecar-injector` binary, as a library so tests drive them directly.
//! `main` only parses flags and calls in here.

pub mod documents;
pub mod render;
pub mod run;
pub mod serve;
pub mod templates;
