//! The epoch ticker: advances the engine's epoch while calls run (so their
//! deadlines fire), and sleeps when none does. (Admitting calls, one per
//! pool slot, is `pool::Slots`'.)

use std::sync::{Condvar, Mutex};
use std::time::Duration;

use wasmtime::EngineWeak;

/// Advances the engine's epoch while at least one call is running, and sleeps
/// otherwise, so an idle daemon spends no CPU on it.
pub(super) struct Ticker {
    state: Mutex<TickerState>,
    wake: Condvar,
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
    }
}

impl Ticker {
    pub(super) fn new() -> Ticker {
        Ticker {
            state: Mutex::default(),
            wake: Condvar::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TickerState> {
        // The state stays consistent even if a holder panicked.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a call as running (the epoch ticks until it is dropped).
    pub(super) fn start_call(&self) -> RunningCall<'_> {
        self.lock().running_calls += 1;
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
