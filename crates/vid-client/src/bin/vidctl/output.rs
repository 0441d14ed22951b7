//! The one output renderer: every command hands its result here, and
//! `--json` decides the form. With `--json`, stdout carries exactly one
//! pretty-printed JSON document (the value, a page as `{"data", "next_cursor"}`,
//! or `{"error": …}`); otherwise the command's human view is printed.
//! Messages for people that are not results (progress, hints, errors) go to
//! stderr in both modes.

use serde::Serialize;
use serde_json::{json, Value};
use vid_client::Page;

use crate::view::{print_page_end, table};

/// The output mode chosen by `--json`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Output {
    json: bool,
}

impl Output {
    /// `json`: machine-readable output (the global `--json` flag).
    pub(crate) fn new(json: bool) -> Self {
        Self { json }
    }

    /// Whether `--json` was given (progress bars are off then).
    pub(crate) fn is_json(self) -> bool {
        self.json
    }

    /// One result: `value` as JSON, or `human(value)` for people.
    pub(crate) fn show<T: Serialize + ?Sized>(self, value: &T, human: impl FnOnce(&T)) {
        if self.json {
            print_json(value);
        } else {
            human(value);
        }
    }

    /// Like [`show`](Self::show), but the JSON document is built only when
    /// it is printed (results assembled from several values).
    pub(crate) fn show_with(self, json: impl FnOnce() -> Value, human: impl FnOnce()) {
        if self.json {
            print_json(&json());
        } else {
            human();
        }
    }

    /// Output only people see, printed before the result (with `--json`,
    /// stdout carries the result alone).
    pub(crate) fn human(self, print: impl FnOnce()) {
        if !self.json {
            print();
        }
    }

    /// A page of a list: `{"data": […], "next_cursor": …}`, or a table with
    /// one row per item followed by the `more: --cursor …` line when there is
    /// a next page.
    pub(crate) fn page<T: Serialize>(self, page: &Page<T>, headers: &[&str], row: impl Fn(&T) -> Vec<String>) {
        self.list(page, headers, row);
        if !self.json {
            print_page_end(&page.next_cursor);
        }
    }

    /// Like [`page`](Self::page) without the cursor line (lists the API
    /// answers in one page).
    pub(crate) fn list<T: Serialize>(self, page: &Page<T>, headers: &[&str], row: impl Fn(&T) -> Vec<String>) {
        if self.json {
            print_json(&json!({ "data": page.data, "next_cursor": page.next_cursor }));
        } else {
            table(headers, &page.data.iter().map(row).collect::<Vec<_>>());
        }
    }

    /// An error as JSON (`{"error": error}`) on stdout with `--json`; nothing
    /// otherwise (the human message goes to stderr, written by the caller).
    pub(crate) fn error(self, error: Value) {
        if self.json {
            println!("{}", json!({ "error": error }));
        }
    }
}

/// Pretty JSON on stdout.
fn print_json(value: &(impl Serialize + ?Sized)) {
    println!("{}", serde_json::to_string_pretty(value).expect("serialises"));
}
