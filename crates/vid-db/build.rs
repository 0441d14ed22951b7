//! `embed_migrations!` reads `migrations/` at compile time; without this a
//! new or edited migration is not embedded until something else in the
//! crate changes (diesel_migrations' documented advice).
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
