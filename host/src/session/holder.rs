//! Who holds a lease, written so that another process on the same machine
//! can tell when the holder has died.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// A lease holder's identity: the process that holds it (the machine's
/// boot, its pid namespace, pid and start time), when that could be read,
/// and a nonce for this one lease.
///
/// A lease ends when it expires, or earlier when [`Holder::is_gone`] can
/// prove its holder dead: it ran on this machine since its last boot, in
/// this pid namespace, and its process no longer exists (or its pid now
/// names a process started at another time). A holder on another machine
/// or in another container is never declared gone; its lease expires.
///
/// Stores keep it as text ([`fmt::Display`]):
/// `boot=…;pidns=…;pid=…;start=…;lease=…`, or `lease=…` alone. Text a store
/// holds that is not in that form reads back as a holder with no process
/// (never declared gone).
///
/// Cloning one is a reference count, and its text is written once: every
/// append a store fences carries and compares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder(Arc<Identity>);

#[derive(Debug, PartialEq, Eq)]
struct Identity {
    process: Option<Process>,
    /// The holder as stores keep it: the process's fields, then the
    /// lease's nonce.
    text: String,
}

/// The process a holder ran in.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Process {
    boot: String,
    pid_ns: String,
    pid: u32,
    /// Field 22 of `/proc/PID/stat`, as written there.
    start: String,
}

impl Process {
    /// This process, as far as it can be read: read from `/proc` once per
    /// process (again in a forked child, whose pid differs).
    fn current() -> Option<Self> {
        static CURRENT: std::sync::Mutex<Option<(u32, Option<Process>)>> =
            std::sync::Mutex::new(None);
        let pid = std::process::id();
        let mut cached = CURRENT
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match &*cached {
            Some((read_by, process)) if *read_by == pid => process.clone(),
            _ => {
                let process = Self::read(pid);
                *cached = Some((pid, process.clone()));
                process
            }
        }
    }

    fn read(pid: u32) -> Option<Self> {
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
        let pid_ns = std::fs::read_link("/proc/self/ns/pid").ok()?;
        Some(Self {
            boot: boot.trim().to_owned(),
            pid_ns: pid_ns.to_string_lossy().into_owned(),
            pid,
            start: start_time(pid)?,
        })
    }
}

/// Field 22 of `/proc/PID/stat`: when the process started, in clock ticks
/// since boot. `None` when there is no such process, or it has exited and
/// waits only to be reaped (a zombie).
fn start_time(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses; fields
    // after it follow the last `)`.
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = fields.next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    fields.nth(18).map(str::to_owned)
}

impl Holder {
    /// A fresh identity for one lease, held by this process.
    pub fn new() -> Self {
        Self::of(
            Process::current(),
            &uuid::Uuid::new_v4().simple().to_string(),
        )
    }

    fn of(process: Option<Process>, nonce: &str) -> Self {
        let mut text = String::new();
        if let Some(p) = &process {
            text = format!(
                "boot={};pidns={};pid={};start={};",
                p.boot, p.pid_ns, p.pid, p.start
            );
        }
        text.push_str("lease=");
        text.push_str(nonce);
        Self(Arc::new(Identity { process, text }))
    }

    /// The holder as stores keep it (its [`fmt::Display`]).
    pub fn as_str(&self) -> &str {
        &self.0.text
    }

    /// Whether this holder is known to be dead (see the type's docs).
    /// `false` whenever that cannot be known. Costs a few reads of `/proc`.
    pub fn is_gone(&self) -> bool {
        let Some(held) = &self.0.process else {
            return false;
        };
        let Some(me) = Process::current() else {
            return false;
        };
        if held.boot != me.boot || held.pid_ns != me.pid_ns {
            return false;
        }
        start_time(held.pid).is_none_or(|now| now != held.start)
    }
}

impl Default for Holder {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Holder {
    type Err = std::convert::Infallible;

    /// Reads a holder back from a store; never fails (see the type's docs).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let field = |name: &str| {
            text.split(';')
                .find_map(|part| part.strip_prefix(name)?.strip_prefix('='))
        };
        let process = match (field("boot"), field("pidns"), field("pid"), field("start")) {
            (Some(boot), Some(pid_ns), Some(pid), Some(start)) => {
                pid.parse().ok().map(|pid| Process {
                    boot: boot.to_owned(),
                    pid_ns: pid_ns.to_owned(),
                    pid,
                    start: start.to_owned(),
                })
            }
            _ => None,
        };
        Ok(Self::of(process, field("lease").unwrap_or(text)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> Holder {
        match text.parse() {
            Ok(holder) => holder,
            Err(never) => match never {},
        }
    }

    #[test]
    fn this_process_is_alive_and_a_dead_one_is_gone() {
        let me = Holder::new();
        let text = me.to_string();
        assert!(text.contains("pid="), "{text}");
        assert_eq!(read(&text), me);
        assert!(!me.is_gone());
        let dead = text.replace(&format!("pid={}", std::process::id()), "pid=4194304");
        assert!(read(&dead).is_gone(), "{dead}");
        let elsewhere = text.replace("boot=", "boot=other-");
        assert!(!read(&elsewhere).is_gone());
        assert!(!read("lease=abc").is_gone());
        assert!(!read("whatever a store holds").is_gone());
    }
}
