//! The web dashboard and the control channel (feature `dashboard`, which builds on
//! `control`), in one binary: `control` acts on a running app from outside through its JSON
//! API (the library's client and raw HTTP); `http` speaks HTTP to the dashboard as a
//! script or an attacker would (access token, cross-site checks, statuses, nothing written on
//! a refusal, the pages' contents against the queue's own reads); `browser` drives the pages
//! in headless Chromium through the DevTools protocol (a count that changes as jobs flow, a
//! retry that moves a dead job). `client` is the raw HTTP client both use.

mod browser;
mod client;
mod control;
mod http;
