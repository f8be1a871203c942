//! The epoch ticker: advances the engine's epoch while calls run (so their
//! deadlines fire), sleeps when none does, and admits at most one call per
//! pool slot.

use std::sync::{Condvar, Mutex};
use std::time::Duration;

use wasmtime::EngineWeak;

/// Advances the engine's epoch while at least one call is running, and sleeps
/// otherwise, so an idle daemon spends no CPU on it. It also admits at most
/// `max_calls` calls at once (one per pool slot).
pub(super) struct Ticker {
    state: Mutex<TickerState>,
    wake: Condvar,
    slot_free: Condvar,
    max_calls: usize,
}

#[derive(Default)]
struct TickerState {
    running_calls: usize,
    stopped: bool,
}

pub(super) struct RunningCall<'a>(&'a Ticker);

impl Drop for RunningCall<'_> {
    fn drop(&mut self) {
        self.0.lock().running_calls -= 1;
        self.0.slot_free.notify_one();
    }
}

impl Ticker {
    pub(super) fn new(max_calls: u32) -> Ticker {
        Ticker {
            state: Mutex::default(),
            wake: Condvar::new(),
            slot_free: Condvar::new(),
            max_calls: max_calls as usize,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TickerState> {
        // The state stays consistent even if a holder panicked.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for a free slot, then counts the call as running.
    pub(super) fn start_call(&self) -> RunningCall<'_> {
        let mut state = self.lock();
        while state.running_calls >= self.max_calls {
            state = self
                .slot_free
                .wait(state)
                .unwrap_or_else(|e| e.into_inner());
        }
        state.running_calls += 1;
        drop(state);
        self.wake.notify_one();
        RunningCall(self)
    }

    pub(super) fn stop(&self) {
        self.lock().stopped = true;
        self.wake.notify_one();
    }

    pub(super) fn run(&self, engine: EngineWeak, tick: Duration) {
        loop {
            {
                let mut state = self.lock();
                while state.running_calls == 0 && !state.stopped {
                    state = self.wake.wait(state).unwrap_or_else(|e| e.into_inner());
                }
                if state.stopped {
                    return;
                }
            }
            std::thread::sleep(tick);
            match engine.upgrade() {
                Some(engine) => engine.increment_epoch(),
                None => return,
            }
        }
    }
}
