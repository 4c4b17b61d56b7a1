"""The seccomp filter of the local sandbox's jail (classic BPF, as bwrap's --seccomp reads it): the
system calls a default container profile refuses and sandboxed Python never needs fail with EPERM,
new namespaces are refused, and a system call made through another ABI than the machine's own
(32-bit calls through int 0x80 on x86-64, AArch32 on arm64) kills the process, since the blocklist
is written in the native numbers and would not hold for the others.
"""

from __future__ import annotations

import os
import struct

# system call: (number on x86-64, number on aarch64, None where aarch64 has no such call)
BLOCKED_SYSCALLS: dict[str, tuple[int, int | None]] = {
    # io_uring: its requests run in kernel workers that no seccomp filter sees, and it has been a
    # steady source of kernel exploits
    "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427),
    # kernel keyrings are not namespaced: keys would be shared with the host's processes
    "add_key": (248, 217),
    "request_key": (249, 218),
    "keyctl": (250, 219),
    # programs run in the kernel, and tracing of the kernel and of other processes: large attack
    # surfaces, and ways to read what a process outside the sandbox does
    "bpf": (321, 280),
    "perf_event_open": (298, 241),
    "lookup_dcookie": (212, 18),
    "fanotify_init": (300, 262),
    # userfaultfd pauses the kernel mid-copy at a page the caller chose: what races in exploits need
    "userfaultfd": (323, 282),
    # reading and writing other processes' memory: only debuggers need it, and it has a long
    # record of kernel bugs
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "kcmp": (312, 272),
    # kernel modules, and replacing the running kernel
    "init_module": (175, 105),
    "finit_module": (313, 273),
    "delete_module": (176, 106),
    "create_module": (174, None),
    "query_module": (178, None),
    "get_kernel_syms": (177, None),
    "kexec_load": (246, 104),
    "kexec_file_load": (320, 294),
    # mounts, swap and quotas: the jail's file system view is fixed from outside
    "mount": (165, 40),
    "umount2": (166, 39),
    "pivot_root": (155, 41),
    "open_tree": (428, 428),
    "move_mount": (429, 429),
    "fsopen": (430, 430),
    "fsconfig": (431, 431),
    "fsmount": (432, 432),
    "fspick": (433, 433),
    "mount_setattr": (442, 442),
    "swapon": (167, 224),
    "swapoff": (168, 225),
    "quotactl": (179, 60),
    "quotactl_fd": (443, 443),
    "nfsservctl": (180, 42),
    "sysfs": (139, None),
    "ustat": (136, None),
    "uselib": (134, None),
    "_sysctl": (156, None),
    # entering another namespace (making one is refused below, by flags)
    "setns": (308, 268),
    # files opened by handle skip the path walk, and with it the jail's bind mounts
    "open_by_handle_at": (304, 265),
    "name_to_handle_at": (303, 264),
    # the host's clock
    "settimeofday": (164, 170),
    "clock_settime": (227, 112),
    "clock_adjtime": (305, 266),
    "adjtimex": (159, 171),
    # the machine itself: port I/O, rebooting, process accounting, terminals, the kernel log
    "iopl": (172, None),
    "ioperm": (173, None),
    "reboot": (169, 142),
    "acct": (163, 89),
    "vhangup": (153, 58),
    "syslog": (103, 116),
}

# (audit arch, unshare, clone, clone3) of the ABIs the blocklist has numbers for, in the order of its columns
NATIVE = {"x86_64": (0xC000003E, 272, 56, 435), "aarch64": (0xC00000B7, 97, 220, 435)}
X32_BIT = 0x40000000  # x86-64's x32 ABI: the audit arch of x86-64, with this bit in the number
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET: a user namespace would give the
# code root inside it, and with it much of the kernel to attack; the others need that root
NEW_NAMESPACES = 0x7E020000
ALLOW, ERRNO, KILL_PROCESS = 0x7FFF0000, 0x00050000, 0x80000000
EPERM, ENOSYS = 1, 38
LOAD, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06  # classic BPF: ld [k], jeq/jge/jset #k, ret #k
NR, ARCH, ARG0 = 0, 4, 16  # offsets in struct seccomp_data (the low half of the first argument)


def supported(machine: str | None = None) -> bool:
    """Whether the filter has this machine's system call numbers (elsewhere it would kill every call)."""
    return (machine or os.uname().machine) in NATIVE


def syscall_filter() -> bytes:
    """The filter of every jailed process. Refused calls fail with EPERM, as in Docker's default
    profile; clone3, whose flags sit in memory a filter cannot read, with ENOSYS, so that the C
    library falls back to clone; x32 numbers with ENOSYS, as on kernels built without x32."""
    program: list[tuple] = []
    for index, (machine, (arch, unshare, clone, clone3)) in enumerate(NATIVE.items()):
        blocked = sorted({numbers[index] for numbers in BLOCKED_SYSCALLS.values() if numbers[index] is not None})
        end = f"{machine}:end"
        program += [
            (LOAD, 0, 0, ARCH),
            (JEQ, 0, end, arch),
            (LOAD, 0, 0, NR),
            (JGE, f"{machine}:enosys", 0, X32_BIT),
            (JEQ, f"{machine}:flags", 0, unshare),
            (JEQ, f"{machine}:flags", 0, clone),
            (JEQ, f"{machine}:enosys", 0, clone3),
            *[(JEQ, f"{machine}:eperm", 0, number) for number in blocked],
            (RET, 0, 0, ALLOW),
            (f"{machine}:flags",),
            (LOAD, 0, 0, ARG0),
            (JSET, f"{machine}:eperm", 0, NEW_NAMESPACES),
            (RET, 0, 0, ALLOW),
            (f"{machine}:eperm",),
            (RET, 0, 0, ERRNO | EPERM),
            (f"{machine}:enosys",),
            (RET, 0, 0, ERRNO | ENOSYS),
            (end,),
        ]
    program.append((RET, 0, 0, KILL_PROCESS))  # another ABI
    return assemble(program)


def assemble(program: list[tuple]) -> bytes:
    """Classic BPF from (code, jump if true, jump if false, k) instructions, where a jump may name a
    label, a 1-tuple placed before the instruction it stands for."""
    labels, pc = {}, 0
    for item in program:
        if len(item) == 1:
            labels[item[0]] = pc
        else:
            pc += 1
    code, pc = b"", 0
    for item in program:
        if len(item) == 1:
            continue
        op, true, false, k = item
        jumps = [labels[j] - pc - 1 if isinstance(j, str) else j for j in (true, false)]
        if not all(0 <= j <= 255 for j in jumps):
            raise ValueError(f"seccomp filter: a jump of {jumps} at instruction {pc} does not fit in a byte")
        code += struct.pack("<HBBI", op, jumps[0], jumps[1], k)
        pc += 1
    return code


FILTER = syscall_filter()


def filter_fd() -> int:
    """A descriptor to pass bwrap as --seccomp (the caller closes it)."""
    fd = os.memfd_create("seccomp")
    os.write(fd, FILTER)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
