//! podstamp's build script, one concern a module: `scaffold` embeds the
//! plugin project templates for `podstamp plugin new`; `link` sets how the
//! `podstamp` binary is linked.

mod link;
mod scaffold;

fn main() {
    scaffold::embed();
    link::pack_relocations();
}
