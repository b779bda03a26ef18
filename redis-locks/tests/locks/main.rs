//! The lock library against real Redis: the local one (`REDIS_URL`, by
//! default `redis://127.0.0.1:6379`) under a key prefix per test, and
//! private `redis-server` processes where a test restarts or freezes one.

mod fairlock;
mod lock;
mod redlock;
mod rwlock;
mod support;
