"""The forked kernels' seccomp filter: an allowlist no wider than Docker's default profile
for a container without capabilities, compiled here (libseccomp through `pyseccomp`) into
classic BPF that the warm parent installs in each child before the kernel runs.

Compared with Docker's default profile (moby's `profiles/seccomp/default.json`) for a
container with every capability dropped, this filter allows the same system calls minus
`ptrace`, `process_vm_readv`/`writev` and the `io_uring_*` calls (Docker allows those; no
kernel needs them), for the native architecture only (Docker also admits 32-bit x86 and
x32 calls; here they are killed). As in Docker's: `socket` for any family but AF_VSOCK
(checked on the whole register, where Docker's rule misses a family with high bits set),
`personality` for the five harmless personas only, `clone` without any namespace flag,
`clone3` answered ENOSYS (so the C library falls back to `clone`, whose flags a filter can
see). Unlike Docker's, `setns` is allowed: a continuation of a snapshot joins its
branch's namespaces with it, and the kernel checks a capability in the user namespace that
owns each target, which a kernel has only in its branch's (made owned by the sandbox uid).
Everything else is EPERM: `mount`, `unshare`, `bpf`, `perf_event_open`,
`keyctl`/`add_key`/`request_key`, `userfaultfd`, `kexec_*`, module loading, `reboot`,
`chroot`, `pivot_root`, the clock setters, `acct`, `swapon`, `open_by_handle_at` ...
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import tempfile
from typing import Any

# The unconditional part of Docker's default allowlist, less the io_uring calls (names the
# installed libseccomp does not know are skipped: their numbers are then denied).
ALLOWED = [
    "accept",
    "accept4",
    "access",
    "adjtimex",
    "alarm",
    "bind",
    "brk",
    "capget",
    "capset",
    "chdir",
    "chmod",
    "chown",
    "clock_adjtime",
    "clock_getres",
    "clock_gettime",
    "clock_nanosleep",
    "close",
    "close_range",
    "connect",
    "copy_file_range",
    "creat",
    "dup",
    "dup2",
    "dup3",
    "epoll_create",
    "epoll_create1",
    "epoll_ctl",
    "epoll_ctl_old",
    "epoll_pwait",
    "epoll_pwait2",
    "epoll_wait",
    "epoll_wait_old",
    "eventfd",
    "eventfd2",
    "execve",
    "execveat",
    "exit",
    "exit_group",
    "faccessat",
    "faccessat2",
    "fadvise64",
    "fallocate",
    "fanotify_mark",
    "fchdir",
    "fchmod",
    "fchmodat",
    "fchown",
    "fchownat",
    "fcntl",
    "fdatasync",
    "fgetxattr",
    "flistxattr",
    "flock",
    "fork",
    "fremovexattr",
    "fsetxattr",
    "fstat",
    "fstatfs",
    "fsync",
    "ftruncate",
    "futex",
    "futex_waitv",
    "futimesat",
    "getcpu",
    "getcwd",
    "getdents",
    "getdents64",
    "getegid",
    "geteuid",
    "getgid",
    "getgroups",
    "getitimer",
    "getpeername",
    "getpgid",
    "getpgrp",
    "getpid",
    "getppid",
    "getpriority",
    "getrandom",
    "getresgid",
    "getresuid",
    "getrlimit",
    "get_robust_list",
    "getrusage",
    "getsid",
    "getsockname",
    "getsockopt",
    "get_thread_area",
    "gettid",
    "gettimeofday",
    "getuid",
    "getxattr",
    "inotify_add_watch",
    "inotify_init",
    "inotify_init1",
    "inotify_rm_watch",
    "io_cancel",
    "ioctl",
    "io_destroy",
    "io_getevents",
    "io_pgetevents",
    "ioprio_get",
    "ioprio_set",
    "io_setup",
    "io_submit",
    "kill",
    "landlock_add_rule",
    "landlock_create_ruleset",
    "landlock_restrict_self",
    "lchown",
    "lgetxattr",
    "link",
    "linkat",
    "listen",
    "listxattr",
    "llistxattr",
    "lremovexattr",
    "lseek",
    "lsetxattr",
    "lstat",
    "madvise",
    "membarrier",
    "memfd_create",
    "memfd_secret",
    "mincore",
    "mkdir",
    "mkdirat",
    "mknod",
    "mknodat",
    "mlock",
    "mlock2",
    "mlockall",
    "mmap",
    "mprotect",
    "mq_getsetattr",
    "mq_notify",
    "mq_open",
    "mq_timedreceive",
    "mq_timedsend",
    "mq_unlink",
    "mremap",
    "msgctl",
    "msgget",
    "msgrcv",
    "msgsnd",
    "msync",
    "munlock",
    "munlockall",
    "munmap",
    "name_to_handle_at",
    "nanosleep",
    "newfstatat",
    "open",
    "openat",
    "openat2",
    "pause",
    "pidfd_open",
    "pidfd_send_signal",
    "pipe",
    "pipe2",
    "pkey_alloc",
    "pkey_free",
    "pkey_mprotect",
    "poll",
    "ppoll",
    "prctl",
    "pread64",
    "preadv",
    "preadv2",
    "prlimit64",
    "process_mrelease",
    "pselect6",
    "pwrite64",
    "pwritev",
    "pwritev2",
    "read",
    "readahead",
    "readlink",
    "readlinkat",
    "readv",
    "recvfrom",
    "recvmmsg",
    "recvmsg",
    "remap_file_pages",
    "removexattr",
    "rename",
    "renameat",
    "renameat2",
    "restart_syscall",
    "rmdir",
    "rseq",
    "rt_sigaction",
    "rt_sigpending",
    "rt_sigprocmask",
    "rt_sigqueueinfo",
    "rt_sigreturn",
    "rt_sigsuspend",
    "rt_sigtimedwait",
    "rt_tgsigqueueinfo",
    "sched_getaffinity",
    "sched_getattr",
    "sched_getparam",
    "sched_get_priority_max",
    "sched_get_priority_min",
    "sched_getscheduler",
    "sched_rr_get_interval",
    "sched_setaffinity",
    "sched_setattr",
    "sched_setparam",
    "sched_setscheduler",
    "sched_yield",
    "seccomp",
    "select",
    "semctl",
    "semget",
    "semop",
    "semtimedop",
    "sendfile",
    "sendmmsg",
    "sendmsg",
    "sendto",
    "setfsgid",
    "setfsuid",
    "setgid",
    "setgroups",
    "setitimer",
    "setpgid",
    "setpriority",
    "setregid",
    "setresgid",
    "setresuid",
    "setreuid",
    "setrlimit",
    "set_robust_list",
    # joining a namespace takes a capability in the user namespace that owns it: the only
    # ones a kernel has are in the user namespace of a branch, which the forkserver makes
    # owned by the sandbox uid for a continuation to join (DESIGN decision 24)
    "setns",
    "setsid",
    "setsockopt",
    "set_thread_area",
    "set_tid_address",
    "setuid",
    "setxattr",
    "shmat",
    "shmctl",
    "shmdt",
    "shmget",
    "shutdown",
    "sigaltstack",
    "signalfd",
    "signalfd4",
    "socketpair",
    "splice",
    "stat",
    "statfs",
    "statx",
    "symlink",
    "symlinkat",
    "sync",
    "sync_file_range",
    "syncfs",
    "sysinfo",
    "tee",
    "tgkill",
    "time",
    "timer_create",
    "timer_delete",
    "timer_getoverrun",
    "timer_gettime",
    "timer_settime",
    "timerfd_create",
    "timerfd_gettime",
    "timerfd_settime",
    "times",
    "tkill",
    "truncate",
    "umask",
    "uname",
    "unlink",
    "unlinkat",
    "utime",
    "utimensat",
    "utimes",
    "vfork",
    "vmsplice",
    "wait4",
    "waitid",
    "write",
    "writev",
    "arch_prctl",
    "modify_ldt",
]
AF_VSOCK = 40
AF_MAX = 46  # Linux 6.x: AF_MCTP (45) is the last family
PERSONAS = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)  # Docker's: linux, linux32 and queries
# CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET: none may be set
NAMESPACE_FLAGS = 0x7E020000


@dataclasses.dataclass(frozen=True)
class Rule:
    """One rule of the filter: `name` allowed (or answered `errno`), when argument 0
    compares as `op` (`LT`, `EQ`, `MASKED_EQ`: `(arg & value) == value_two`) with `value`."""

    name: str
    op: str | None = None
    value: int = 0
    value_two: int = 0
    errno: int | None = None


def rules() -> list[Rule]:
    """The whole filter, past its default (EPERM), as data: compiled for the forked kernels
    (`compile_filter`) and written as a Docker profile (`docker_profile`) from this one list,
    so the two backends cannot drift apart."""
    found = [Rule(name) for name in ALLOWED]
    # Every family but AF_VSOCK, compared as the 64-bit register the call passes: Docker's
    # `!= 40` lets 0x1_0000_0028 through, which the kernel reads as the int 40, AF_VSOCK;
    # here the families below it, then those above it one by one (a family the kernel does
    # not know is EPERM rather than EAFNOSUPPORT)
    found.append(Rule("socket", "LT", AF_VSOCK))
    found += [Rule("socket", "EQ", family) for family in range(AF_VSOCK + 1, AF_MAX)]
    found += [Rule("personality", "EQ", persona) for persona in PERSONAS]
    found.append(Rule("clone", "MASKED_EQ", NAMESPACE_FLAGS, 0))
    found.append(Rule("clone3", errno=errno.ENOSYS))
    return found


def compile_filter() -> bytes:
    """The filter as classic BPF (struct sock_filter, native byte order)."""
    import pyseccomp as seccomp

    program_rules = seccomp.SyscallFilter(seccomp.ERRNO(errno.EPERM))
    # a binary tree of syscall numbers, not a list: each of the kernel's system calls is
    # found in about 9 comparisons, and the filter loads in 0.14 ms, not 0.33 (measured
    # 2026-12-06; bench/README.md)
    program_rules.set_attr(seccomp.Attr.CTL_OPTIMIZE, 2)
    for rule in rules():
        action = seccomp.ALLOW if rule.errno is None else seccomp.ERRNO(rule.errno)
        args = []
        if rule.op is not None:
            args.append(seccomp.Arg(0, getattr(seccomp, rule.op), rule.value, rule.value_two))
        try:
            program_rules.add_rule(action, rule.name, *args)
        except (RuntimeError, ValueError, OSError):  # a call unknown to this libseccomp
            if rule.op is not None or rule.errno is not None:
                raise  # only plain names may be unknown: a rule with terms must hold
    with tempfile.TemporaryFile() as out:
        program_rules.export_bpf(out)
        out.seek(0)
        program = out.read()
    if not program or len(program) % 8:
        raise RuntimeError("libseccomp made no usable filter")
    return program


def docker_profile() -> str:
    """The same filter as a Docker seccomp profile (JSON, for `--security-opt seccomp=`):
    the Docker backend's containers get it instead of the engine's default, whose `socket`
    rule has the AF_VSOCK hole above."""
    plain = [rule.name for rule in rules() if rule.op is None and rule.errno is None]
    syscalls: list[dict[str, Any]] = [{"names": plain, "action": "SCMP_ACT_ALLOW"}]
    for rule in rules():
        if rule.op is None and rule.errno is None:
            continue
        entry: dict[str, Any] = {"names": [rule.name], "action": "SCMP_ACT_ALLOW"}
        if rule.errno is not None:
            entry.update(action="SCMP_ACT_ERRNO", errnoRet=rule.errno)
        if rule.op is not None:
            compare = {"index": 0, "value": rule.value, "valueTwo": rule.value_two}
            entry["args"] = [{**compare, "op": f"SCMP_CMP_{rule.op}"}]
        syscalls.append(entry)
    profile = {
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": errno.EPERM,
        "architectures": ["SCMP_ARCH_X86_64"],
        "syscalls": syscalls,
    }
    return json.dumps(profile, separators=(",", ":"))


def write_filter(path: str) -> None:
    """Compile the filter into `path` (mode 0444)."""
    program = compile_filter()
    with open(path, "wb") as out:
        out.write(program)
    os.chmod(path, 0o444)
