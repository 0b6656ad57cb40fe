//! The `airlock` binary on a pseudo-terminal: what a person at a terminal
//! sees (prompts, progress, colour, the echo of what they type), read as it
//! comes, and answers typed when the screen asks for them.

use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// A child whose standard input, output and error are one terminal.
pub struct Terminal {
    child: Child,
    typed: std::fs::File,
    screen: Arc<(Mutex<Screen>, Condvar)>,
}

#[derive(Default)]
struct Screen {
    text: String,
    closed: bool,
}

impl Terminal {
    /// Starts `command` on a new pseudo-terminal.
    pub fn start(mut command: Command) -> Self {
        let (master, slave) = open_pty();
        let io = |fd: &OwnedFd| Stdio::from(fd.try_clone().unwrap());
        command
            .stdin(io(&slave))
            .stdout(io(&slave))
            .stderr(io(&slave));
        let child = command.spawn().expect("the binary starts");
        drop(slave);
        let typed = std::fs::File::from(master.try_clone().unwrap());
        let mut reader = std::fs::File::from(master);
        let screen = Arc::new((Mutex::new(Screen::default()), Condvar::new()));
        let shared = Arc::clone(&screen);
        std::thread::spawn(move || {
            let mut buffer = [0u8; 4096];
            loop {
                // EIO once the last writer on the terminal has gone.
                let n = reader.read(&mut buffer).unwrap_or(0);
                let (screen, changed) = &*shared;
                let mut screen = screen.lock().unwrap();
                if n == 0 {
                    screen.closed = true;
                    changed.notify_all();
                    return;
                }
                // The terminal writes `\r\n` for each newline.
                let text = String::from_utf8_lossy(&buffer[..n]).replace('\r', "");
                screen.text.push_str(&text);
                changed.notify_all();
            }
        });
        Self {
            child,
            typed,
            screen,
        }
    }

    /// The screen once `ready` holds for it (or the terminal closed: then
    /// it fails, showing the screen). Waits at most a minute.
    pub fn wait_for(&self, what: &str, ready: impl Fn(&str) -> bool) -> String {
        let (screen, changed) = &*self.screen;
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut screen = screen.lock().unwrap();
        loop {
            if ready(&screen.text) {
                return screen.text.clone();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !screen.closed && !left.is_zero(),
                "never saw {what}; the screen:\n{}",
                screen.text
            );
            screen = changed.wait_timeout(screen, left).unwrap().0;
        }
    }

    /// Types `text` (with its newline, if it has one).
    pub fn type_in(&mut self, text: &str) {
        self.typed.write_all(text.as_bytes()).unwrap();
    }

    /// Waits for the child to exit and the terminal to close: its exit
    /// code and the whole screen.
    pub fn finish(mut self) -> (Option<i32>, String) {
        let status = self.child.wait().unwrap();
        // The child's descriptors are closed; the reader's next read ends.
        let (screen, changed) = &*self.screen;
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut screen = screen.lock().unwrap();
        while !screen.closed {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "the terminal stayed open:\n{}",
                screen.text
            );
            screen = changed.wait_timeout(screen, left).unwrap().0;
        }
        (status.code(), screen.text.clone())
    }
}

/// A new pseudo-terminal, both ends close-on-exec (opened so, not marked
/// after: a child another test starts meanwhile must not keep the terminal
/// open).
#[allow(unsafe_code)]
fn open_pty() -> (OwnedFd, OwnedFd) {
    let last = || std::io::Error::last_os_error();
    // SAFETY: plain system calls on descriptors this function opens; each
    // result is checked before use, and ptsname_r writes at most the
    // buffer's length.
    unsafe {
        let master = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        assert!(master >= 0, "posix_openpt: {}", last());
        let master = OwnedFd::from_raw_fd(master);
        use std::os::fd::AsRawFd;
        assert_eq!(libc::grantpt(master.as_raw_fd()), 0, "grantpt: {}", last());
        assert_eq!(
            libc::unlockpt(master.as_raw_fd()),
            0,
            "unlockpt: {}",
            last()
        );
        let mut name = [0 as libc::c_char; 128];
        assert_eq!(
            libc::ptsname_r(master.as_raw_fd(), name.as_mut_ptr(), name.len()),
            0,
            "ptsname_r: {}",
            last()
        );
        let slave = libc::open(
            name.as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        );
        assert!(slave >= 0, "open the terminal: {}", last());
        (master, OwnedFd::from_raw_fd(slave))
    }
}
