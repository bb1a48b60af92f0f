#include "reward_server/sandbox/seccomp_filter.h"

#include <errno.h>
#include <sched.h>
#include <seccomp.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>

#include "absl/strings/str_cat.h"

namespace sluice::reward_server::sandbox {
namespace {

// Denied outright with EPERM. Names unknown on this architecture are skipped.
constexpr const char* kDeniedSyscalls[] = {
    "ptrace",          "process_vm_readv",  "process_vm_writev", "kcmp",
    "pidfd_getfd",     "unshare",           "setns",             "mount",
    "umount",          "umount2",           "pivot_root",        "chroot",
    "fsopen",          "fsconfig",          "fsmount",           "fspick",
    "move_mount",      "open_tree",         "mount_setattr",     "keyctl",
    "add_key",         "request_key",       "bpf",               "perf_event_open",
    "userfaultfd",     "io_uring_setup",    "io_uring_enter",    "io_uring_register",
    "kexec_load",      "kexec_file_load",   "init_module",       "finit_module",
    "delete_module",   "reboot",            "swapon",            "swapoff",
    "acct",            "quotactl",          "quotactl_fd",       "open_by_handle_at",
    "name_to_handle_at", "syslog",          "lookup_dcookie",    "nfsservctl",
    "uselib",          "vhangup",           "iopl",              "ioperm",
    "settimeofday",    "clock_settime",     "clock_adjtime",     "adjtimex",
    "sethostname",     "setdomainname",
    // POSIX message queues outlive their processes in the IPC namespace, which
    // a pool slot keeps from one program to the next, and cannot be listed
    // without mounting mqueue; programs (HumanEval, MBPP, ...) do not use them.
    "mq_open",         "mq_unlink",
};

constexpr unsigned long kNamespaceCloneFlags[] = {
    CLONE_NEWNS,  CLONE_NEWUSER, CLONE_NEWPID,   CLONE_NEWNET,
    CLONE_NEWIPC, CLONE_NEWUTS,  CLONE_NEWCGROUP,
#ifdef CLONE_NEWTIME
    CLONE_NEWTIME,
#endif
};

struct ContextDeleter {
  void operator()(scmp_filter_ctx ctx) const { seccomp_release(ctx); }
};

absl::Status Check(int rc, absl::string_view what) {
  if (rc == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("seccomp: ", what, ": ", strerror(-rc)));
}

}  // namespace

absl::StatusOr<std::string> BuildSeccompFilterBpf() {
  std::unique_ptr<void, ContextDeleter> ctx(seccomp_init(SCMP_ACT_ALLOW));
  if (ctx == nullptr) return absl::InternalError("seccomp_init failed");
  scmp_filter_ctx c = ctx.get();
  // A foreign ABI kills the whole process (the default kills only the thread).
  if (const int rc = seccomp_attr_set(c, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS); rc != 0) {
    return Check(rc, "foreign ABI action");
  }
  const uint32_t deny = SCMP_ACT_ERRNO(EPERM);
  for (const char* name : kDeniedSyscalls) {
    const int nr = seccomp_syscall_resolve_name(name);
    if (nr == __NR_SCMP_ERROR) continue;
    const int rc = seccomp_rule_add(c, deny, nr, 0);
    // -EDOM/-EINVAL: a name libseccomp knows but this ABI lacks (iopl on
    // arm64); nothing to deny.
    if (rc == -EDOM || rc == -EINVAL) continue;
    if (rc != 0) return Check(rc, absl::StrCat("deny ", name));
  }
  // Sockets: AF_UNIX only.
  if (const int rc = seccomp_rule_add(c, deny, SCMP_SYS(socket), 1,
                                      SCMP_A0(SCMP_CMP_NE, AF_UNIX));
      rc != 0) {
    return Check(rc, "socket");
  }
  if (const int rc = seccomp_rule_add(c, deny, SCMP_SYS(socketpair), 1,
                                      SCMP_A0(SCMP_CMP_NE, AF_UNIX));
      rc != 0) {
    return Check(rc, "socketpair");
  }
  // clone with any namespace flag. One rule per flag: rules are OR-ed, and a
  // masked comparison tests one bit pattern.
  for (unsigned long flag : kNamespaceCloneFlags) {
    const int rc = seccomp_rule_add(c, deny, SCMP_SYS(clone), 1,
                                    SCMP_A0(SCMP_CMP_MASKED_EQ, flag, flag));
    if (rc != 0) return Check(rc, "clone");
  }
  if (const int rc = seccomp_rule_add(c, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0); rc != 0) {
    return Check(rc, "clone3");
  }
  for (unsigned long request : {static_cast<unsigned long>(TIOCSTI),
                                static_cast<unsigned long>(TIOCLINUX)}) {
    const int rc = seccomp_rule_add(c, deny, SCMP_SYS(ioctl), 1,
                                    SCMP_A1(SCMP_CMP_MASKED_EQ, 0xFFFFFFFFu, request));
    if (rc != 0) return Check(rc, "ioctl");
  }

  // Export through a memfd: libseccomp only writes BPF to a descriptor.
  const int fd = memfd_create("sluice-seccomp", MFD_CLOEXEC);
  if (fd < 0) return absl::InternalError(absl::StrCat("memfd_create: ", strerror(errno)));
  const int rc = seccomp_export_bpf(c, fd);
  if (rc != 0) {
    close(fd);
    return Check(rc, "export");
  }
  std::string bpf;
  char buffer[4096];
  ssize_t n;
  if (lseek(fd, 0, SEEK_SET) != 0) {
    close(fd);
    return absl::InternalError(absl::StrCat("lseek: ", strerror(errno)));
  }
  while ((n = read(fd, buffer, sizeof(buffer))) > 0) bpf.append(buffer, n);
  const int read_errno = errno;
  close(fd);
  if (n < 0) return absl::InternalError(absl::StrCat("reading BPF: ", strerror(read_errno)));
  if (bpf.empty()) return absl::InternalError("seccomp exported an empty filter");
  return bpf;
}

}  // namespace sluice::reward_server::sandbox
