//! A call's clock readings and random bytes: recorded as the guest reads
//! them, or played back from the [`Tape`] a journaled call recorded.
//!
//! Invariants:
//!
//! - Only the sources a component imports are served from a reel; the
//!   others keep wasmtime's defaults, and a component that imports none
//!   costs nothing here.
//! - Recording never changes what the guest gets: real time, and bytes
//!   of a ChaCha20 stream seeded from the operating system's generator
//!   (what wasmtime's default is made of). Its seed is what is kept; a
//!   clock's readings are kept up to a bound, and past it the tape says
//!   so.
//! - Played back, the guest gets the recorded readings in the recorded
//!   order and the recorded seeds' streams. A reading past them, or a
//!   generator the recorded call had none of, gets a real value, and the
//!   tape says what ran short: the call is not a reproduction.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use rand::rngs::ChaCha20Rng;
use rand::{Rng, SeedableRng};
use wasmtime::Engine;
use wasmtime::component::Component;
use wasmtime_wasi::WasiCtxBuilder;
use wasmtime_wasi::clocks::{HostMonotonicClock, HostWallClock};

use crate::spec::Tape;

/// The nondeterministic sources a component imports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Sources {
    wall: bool,
    monotonic: bool,
    random: bool,
    insecure: bool,
    seed: bool,
}

impl Sources {
    /// What `component` imports of wasi:clocks and wasi:random (a
    /// component's imports are fixed, so this is read once, at load).
    pub(crate) fn of(component: &Component, engine: &Engine) -> Self {
        let mut sources = Self::default();
        for (name, _) in component.component_type().imports(engine) {
            let interface = name.split('@').next().unwrap_or(name);
            match interface {
                "wasi:clocks/wall-clock" => sources.wall = true,
                "wasi:clocks/monotonic-clock" => sources.monotonic = true,
                "wasi:random/random" => sources.random = true,
                "wasi:random/insecure" => sources.insecure = true,
                "wasi:random/insecure-seed" => sources.seed = true,
                _ => {}
            }
        }
        sources
    }

    pub(crate) fn any(self) -> bool {
        self.wall || self.monotonic || self.random || self.insecure || self.seed
    }
}

/// What one call's sources read from, shared by them and the call's
/// state (which takes the tape when the call ends).
#[derive(Debug, Clone)]
pub(crate) struct Reel(Arc<Mutex<Deck>>);

#[derive(Debug, Default)]
struct Deck {
    /// Recording: what was read so far. Playing: what ran short, in
    /// `past`.
    tape: Tape,
    /// Playing: the recorded tape, and how far each source has read it.
    played: Option<(Arc<Tape>, Cursors)>,
    /// Recording: the bytes of HTTP bodies and files kept so far.
    kept_bytes: usize,
}

#[derive(Debug, Default)]
struct Cursors {
    wall: usize,
    monotonic: usize,
    http: usize,
}

impl Reel {
    /// Serves `sources` of a new call from a reel: recording what they
    /// give (and what it reads through its grants, when `records`), or
    /// playing `played` back. `None` when there is nothing to record or
    /// play back (the builder is left as it was).
    pub(crate) fn arm(
        wasi: &mut WasiCtxBuilder,
        sources: Sources,
        records: bool,
        played: Option<Arc<Tape>>,
    ) -> Option<Self> {
        if !sources.any() && !records && played.is_none() {
            return None;
        }
        let mut deck = Deck::default();
        if sources.seed {
            let seed = match &played {
                Some(tape) => {
                    let recorded = tape
                        .seed
                        .as_deref()
                        .and_then(|s| u128::from_str_radix(s, 16).ok());
                    if recorded.is_none() {
                        deck.tape.past = Some(
                            "reads wasi:random/insecure-seed, which the recorded call had no value of"
                                .into(),
                        );
                    }
                    recorded.unwrap_or_else(rand::random)
                }
                None => {
                    let seed = rand::random::<u128>();
                    deck.tape.seed = Some(format!("{seed:032x}"));
                    seed
                }
            };
            wasi.insecure_random_seed(seed);
        }
        deck.played = played.map(|tape| (tape, Cursors::default()));
        let reel = Self(Arc::new(Mutex::new(deck)));
        let started = Instant::now();
        if sources.wall {
            wasi.wall_clock(Wall(reel.clone()));
        }
        if sources.monotonic {
            wasi.monotonic_clock(Monotonic {
                reel: reel.clone(),
                started,
            });
        }
        if sources.random {
            wasi.secure_random(reel.generator(Generator::Secure));
        }
        if sources.insecure {
            wasi.insecure_random(reel.generator(Generator::Insecure));
        }
        Some(reel)
    }

    /// Keeps the environment variables the call was given (a recording
    /// call whose policy says `record = true`).
    pub(crate) fn keep_env(&self, env: std::collections::BTreeMap<String, Option<String>>) {
        self.deck().tape.env = env;
    }

    /// The tape so far, leaving an empty one: what was recorded, or,
    /// played back, only what ran short.
    pub(crate) fn take(&self) -> Tape {
        std::mem::take(&mut self.deck().tape)
    }

    /// `generator`'s ChaCha20: seeded from the operating system's
    /// generator, the seed kept; or, played back, from the recorded seed.
    fn generator(&self, generator: Generator) -> ChaCha20Rng {
        let mut deck = self.deck();
        let played = deck.played.as_ref().map(|(tape, _)| Arc::clone(tape));
        if let Some(tape) = played {
            let recorded = match generator {
                Generator::Secure => tape.random.as_deref(),
                Generator::Insecure => tape.insecure.as_deref(),
            };
            let seed = recorded
                .and_then(|text| STANDARD.decode(text).ok())
                .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok());
            if let Some(seed) = seed {
                return ChaCha20Rng::from_seed(seed);
            }
            deck.short(|| {
                format!(
                    "imports {}, which the recorded call had no seed of",
                    generator.name()
                )
            });
        }
        let mut seed = [0u8; 32];
        rand::rng().fill_bytes(&mut seed);
        if deck.played.is_none() {
            let kept = Some(STANDARD.encode(seed));
            match generator {
                Generator::Secure => deck.tape.random = kept,
                Generator::Insecure => deck.tape.insecure = kept,
            }
        }
        ChaCha20Rng::from_seed(seed)
    }

    /// Keeps the HTTP exchange `exchange` makes (only then: its body is
    /// encoded there), while the tape has room for its `body_bytes`; past
    /// that, notes that the call cannot be reproduced.
    pub(crate) fn keep_exchange(
        &self,
        body_bytes: usize,
        exchange: impl FnOnce() -> crate::spec::Exchange,
    ) {
        if self.room_for(body_bytes) {
            self.deck().tape.http.push(exchange());
        }
    }

    /// Counts `bytes` more of HTTP bodies or files kept, if the tape has
    /// room for them; past that, notes that the call cannot be reproduced.
    pub(crate) fn room_for(&self, bytes: usize) -> bool {
        let mut deck = self.deck();
        let kept = deck.kept_bytes.saturating_add(bytes);
        if kept <= Tape::MAX_RECORDED_BYTES {
            deck.kept_bytes = kept;
            return true;
        }
        deck.short(|| {
            format!(
                "read more than {} bytes of HTTP responses and files to record",
                Tape::MAX_RECORDED_BYTES
            )
        });
        false
    }

    /// The recorded response to a replayed call's next request, if it is
    /// the request the recorded call sent next (same method and URL);
    /// otherwise notes why the call cannot be reproduced.
    pub(crate) fn next_exchange(&self, method: &str, url: &str) -> Option<crate::spec::Exchange> {
        let mut deck = self.deck();
        let next = deck.played.as_mut().and_then(|(tape, cursors)| {
            let exchange = tape.http.get(cursors.http)?;
            (exchange.method == method && exchange.url == url).then(|| {
                cursors.http += 1;
                exchange.clone()
            })
        });
        if next.is_none() {
            let recorded = deck
                .played
                .as_ref()
                .is_some_and(|(tape, _)| !tape.http.is_empty());
            deck.short(|| {
                if recorded {
                    format!("sends a request its recorded call did not send next ({method} {url})")
                } else {
                    "sends HTTP requests, which are not recorded".to_owned()
                }
            });
        }
        next
    }

    /// Notes that the call did something a replay does not reproduce
    /// (the first such reason is kept).
    pub(crate) fn short(&self, why: &str) {
        self.deck().short(|| why.to_owned());
    }

    fn deck(&self) -> MutexGuard<'_, Deck> {
        // Nothing panics while holding it; a poisoned lock still holds a
        // whole tape.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Deck {
    /// Notes the first reason the call is not reproducible.
    fn short(&mut self, why: impl FnOnce() -> String) {
        if self.tape.past.is_none() {
            self.tape.past = Some(why());
        }
    }

    /// A clock reading: the recorded one, or `now` (kept if there is room).
    fn reading(&mut self, clock: Clock, now: impl FnOnce() -> u64) -> u64 {
        if let Some((played, cursors)) = &mut self.played {
            let (values, at) = match clock {
                Clock::Wall => (&played.wall, &mut cursors.wall),
                Clock::Monotonic => (&played.monotonic, &mut cursors.monotonic),
            };
            if let Some(value) = values.get(*at) {
                *at += 1;
                return *value;
            }
            let recorded = values.len();
            self.short(|| {
                format!(
                    "reads the {} more often than the recorded call ({recorded} times)",
                    clock.name()
                )
            });
            return now();
        }
        let value = now();
        let kept = match clock {
            Clock::Wall => &mut self.tape.wall,
            Clock::Monotonic => &mut self.tape.monotonic,
        };
        if kept.len() < Tape::MAX_CLOCK_READS {
            kept.push(value);
        } else {
            self.short(|| {
                format!(
                    "read the {} more than {} times",
                    clock.name(),
                    Tape::MAX_CLOCK_READS
                )
            });
        }
        value
    }
}

#[derive(Debug, Clone, Copy)]
enum Clock {
    Wall,
    Monotonic,
}

impl Clock {
    fn name(self) -> &'static str {
        match self {
            Clock::Wall => "wall clock",
            Clock::Monotonic => "monotonic clock",
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Generator {
    Secure,
    Insecure,
}

impl Generator {
    fn name(self) -> &'static str {
        match self {
            Generator::Secure => "wasi:random/random",
            Generator::Insecure => "wasi:random/insecure",
        }
    }
}

/// `wasi:clocks/wall-clock` through a reel.
struct Wall(Reel);

impl HostWallClock for Wall {
    fn resolution(&self) -> Duration {
        Duration::from_nanos(1)
    }

    fn now(&self) -> Duration {
        let nanos = self.0.deck().reading(Clock::Wall, || {
            let since = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
        });
        Duration::from_nanos(nanos)
    }
}

/// `wasi:clocks/monotonic-clock` through a reel: nanoseconds since the
/// call's state was made.
struct Monotonic {
    reel: Reel,
    started: Instant,
}

impl HostMonotonicClock for Monotonic {
    fn resolution(&self) -> u64 {
        1
    }

    fn now(&self) -> u64 {
        self.reel.deck().reading(Clock::Monotonic, || {
            u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recording() -> Reel {
        Reel(Arc::new(Mutex::new(Deck::default())))
    }

    fn playing(tape: Tape) -> Reel {
        Reel(Arc::new(Mutex::new(Deck {
            played: Some((Arc::new(tape), Cursors::default())),
            ..Deck::default()
        })))
    }

    #[test]
    fn what_is_recorded_plays_back_and_then_runs_short() {
        let reel = recording();
        let mut random = reel.generator(Generator::Secure);
        let (a, b) = (random.next_u32(), random.next_u64());
        let mut filled = [0u8; 5];
        random.fill_bytes(&mut filled);
        let wall = Wall(reel.clone()).now();
        let tape = reel.take();
        assert_eq!(tape.random.as_ref().map(String::len), Some(44));
        assert_eq!((tape.wall.len(), tape.insecure.as_ref()), (1, None));
        assert_eq!(tape.past, None);

        let reel = playing(tape);
        let mut random = reel.generator(Generator::Secure);
        assert_eq!((random.next_u32(), random.next_u64()), (a, b));
        let mut again = [0u8; 5];
        random.fill_bytes(&mut again);
        assert_eq!(again, filled);
        assert_eq!(Wall(reel.clone()).now(), wall);
        assert_eq!(reel.take().past, None);
        let _ = Wall(reel.clone()).now();
        let past = reel.take().past.unwrap_or_default();
        assert!(past.contains("wall clock more often"), "{past}");
        let _ = reel.generator(Generator::Insecure);
        let past = reel.take().past.unwrap_or_default();
        assert!(past.contains("wasi:random/insecure"), "{past}");
    }

    #[test]
    fn a_tape_keeps_its_bounds() {
        let reel = recording();
        let clock = Monotonic {
            reel: reel.clone(),
            started: Instant::now(),
        };
        for _ in 0..=Tape::MAX_CLOCK_READS {
            clock.now();
        }
        let tape = reel.take();
        assert_eq!(tape.monotonic.len(), Tape::MAX_CLOCK_READS);
        let past = tape.past.unwrap_or_default();
        assert!(past.contains("more than 1024 times"), "{past}");
    }
}
