//! Who holds a lease, written so that another process on the same machine
//! can tell when the holder has died.

/// A lease holder's identity: the machine's boot, the process (its pid
/// namespace, pid and start time) and a nonce for this one lease.
///
/// A lease ends when it expires, or earlier when [`Holder::is_gone`] can
/// prove its holder dead: it ran on this machine since its last boot, in
/// this pid namespace, and its process no longer exists (or its pid now
/// names a process started at another time). A holder on another machine
/// or in another container is never declared gone; its lease expires.
#[derive(Debug, Clone, Copy)]
pub struct Holder;

/// The identity of this process, as far as it can be read.
struct ThisProcess {
    boot: String,
    pid_ns: String,
    pid: u32,
    start: String,
}

fn this_process() -> Option<ThisProcess> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let pid_ns = std::fs::read_link("/proc/self/ns/pid").ok()?;
    let pid = std::process::id();
    Some(ThisProcess {
        boot: boot.trim().to_owned(),
        pid_ns: pid_ns.to_string_lossy().into_owned(),
        pid,
        start: start_time(pid)?,
    })
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
    /// A fresh identity for one lease.
    pub fn new_identity() -> String {
        let nonce = uuid::Uuid::new_v4().simple();
        match this_process() {
            Some(p) => format!(
                "boot={};pidns={};pid={};start={};lease={nonce}",
                p.boot, p.pid_ns, p.pid, p.start
            ),
            None => format!("lease={nonce}"),
        }
    }

    /// Whether the holder `identity` is known to be dead (see the type's
    /// docs). `false` whenever that cannot be known.
    pub fn is_gone(identity: &str) -> bool {
        let field = |name: &str| {
            identity
                .split(';')
                .find_map(|part| part.strip_prefix(name)?.strip_prefix('='))
        };
        let (Some(boot), Some(pid_ns), Some(pid), Some(start)) =
            (field("boot"), field("pidns"), field("pid"), field("start"))
        else {
            return false;
        };
        let Some(me) = this_process() else {
            return false;
        };
        if boot != me.boot || pid_ns != me.pid_ns {
            return false;
        }
        let Ok(pid) = pid.parse::<u32>() else {
            return false;
        };
        start_time(pid).is_none_or(|now| now != start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_dead_one_is_gone() {
        let me = Holder::new_identity();
        assert!(me.contains("pid="), "{me}");
        assert!(!Holder::is_gone(&me));
        let dead = me.replace(&format!("pid={}", std::process::id()), "pid=4194304");
        assert!(Holder::is_gone(&dead), "{dead}");
        let elsewhere = me.replace("boot=", "boot=other-");
        assert!(!Holder::is_gone(&elsewhere));
        assert!(!Holder::is_gone("lease=abc"));
    }
}
