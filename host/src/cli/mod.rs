//! The binary's commands, one file each, with their arguments: `render`,
//! `run` (the daemon's flags; the daemon itself is the library's
//! [`podstamp::daemon`]), `test` (golden cases), `status`, `plugin_new`
//! (`podstamp plugin new`), `oci` (`podstamp plugin push|pull`) and
//! `completion` (shell completions; the kubectl plugin's name); `examples`
//! holds the commands' `--help` examples. The
//! dispatch, the remaining small plugin subcommands and the exit codes are
//! in `main.rs`.

pub mod completion;
pub mod examples;
pub mod oci;
pub mod plugin_new;
pub mod render;
pub mod run;
pub mod status;
pub mod test;
