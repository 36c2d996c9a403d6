#include "parallel/dist.h"

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "common/error.h"

namespace ptrain {

namespace {
const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

int to_int(const char* name, const char* value) {
  try {
    size_t used = 0;
    const int v = std::stoi(value, &used);
    if (used == std::string(value).size()) return v;
  } catch (const std::exception&) {
  }
  throw UsageError(std::string("environment variable ") + name + "='" + value + "' is not an integer");
}

bool from(DistEnv& d, const char* launcher, const char* rank, const char* size, const char* local) {
  if (!env(rank) || !env(size)) return false;
  d.launcher = launcher;
  d.rank = to_int(rank, env(rank));
  d.world_size = to_int(size, env(size));
  d.local_rank = local && env(local) ? to_int(local, env(local)) : 0;
  if (d.world_size < 1 || d.rank < 0 || d.rank >= d.world_size)
    throw UsageError(std::string(launcher) + " environment says rank " + std::to_string(d.rank) + " of world size " +
                     std::to_string(d.world_size) + "; check " + rank + " and " + size);
  return true;
}
}  // namespace

DistEnv DistEnv::detect() {
  DistEnv d;
  if (from(d, "openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK")) return d;
  if (from(d, "pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID")) return d;
  if (from(d, "slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")) return d;
  if (from(d, "torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK")) return d;
  return d;
}

int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

}  // namespace ptrain
