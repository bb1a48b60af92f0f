#ifndef SLUICE_REWARD_SERVER_SANDBOX_SECCOMP_FILTER_H_
#define SLUICE_REWARD_SERVER_SANDBOX_SECCOMP_FILTER_H_

#include <string>

#include "absl/status/statusor.h"

namespace sluice::reward_server::sandbox {

// The seccomp filter applied to the sandboxed program (by bwrap, just before
// it execs the program, so that bwrap's own namespace and mount set-up is not
// filtered), as a classic BPF program: an array of struct sock_filter, ready
// for bwrap's `--seccomp FD`.
//
// It is a deny list on top of the namespaces, not the sandbox's only wall:
// everything not listed is allowed, so ordinary Python (threads, fork,
// subprocess, AF_UNIX sockets, multiprocessing) runs. Denied with EPERM:
//   - sockets of any family but AF_UNIX (the network namespace already has
//     no route out; this also closes netlink, packet and vsock sockets);
//   - debugging and cross-process memory access: ptrace,
//     process_vm_readv/writev, kcmp, pidfd_getfd;
//   - new namespaces and mounts: unshare, setns, clone/clone3 with CLONE_NEW*
//     flags, mount, umount2, pivot_root, chroot and the new mount API
//     (fsopen, fsmount, move_mount, open_tree, ...);
//   - kernel surfaces a test never needs: keyctl, add_key, request_key, bpf,
//     perf_event_open, userfaultfd, io_uring_*, kexec_*, module loading,
//     reboot, swapon/swapoff, acct, quotactl, open_by_handle_at, syslog,
//     terminal injection (ioctl TIOCSTI / TIOCLINUX).
// clone3 answers ENOSYS (its flags sit behind a pointer that seccomp cannot
// inspect), which makes glibc fall back to clone, whose flags it can.
// System calls of a foreign ABI (e.g. 32-bit int 0x80 on x86-64) kill the
// process.
absl::StatusOr<std::string> BuildSeccompFilterBpf();

}  // namespace sluice::reward_server::sandbox

#endif  // SLUICE_REWARD_SERVER_SANDBOX_SECCOMP_FILTER_H_
