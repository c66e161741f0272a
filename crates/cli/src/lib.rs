//! The commands of the `sidecar-injector` binary, as a library so tests drive them directly.
//! `main` only parses flags ([`args`]) and hands over to [`process`].

pub mod args;
pub mod completion;
pub mod documents;
pub mod kubectl;
pub mod policy;
pub mod process;
pub mod render;
pub mod run;
pub mod serve;
pub mod templates;
