//! The web dashboard (feature `dashboard`), in one binary: `http` speaks HTTP to it as a
//! script or an attacker would (access token, cross-site checks, statuses, nothing written on
//! a refusal, the pages' contents against the queue's own reads); `browser` drives the pages
//! in headless Chromium through the DevTools protocol (a count that changes as jobs flow, a
//! retry that moves a dead job). `client` is the raw HTTP client both use.

mod browser;
mod client;
mod http;
