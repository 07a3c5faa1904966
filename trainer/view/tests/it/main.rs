//! grove-view's tests, one binary: the API and the HTTP server over raw loopback sockets
//! (`api.rs`), and the page in headless Chromium driven over the DevTools protocol
//! (`browser.rs`, through the library's `browser_check`, the `browser-check` feature this
//! package's dev-dependency on itself enables); `fixture.rs` writes the run folders and
//! `server.rs` starts the view server in-process and speaks raw HTTP to it.

mod api;
mod browser;
mod fixture;
mod server;
