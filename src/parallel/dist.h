// Where this process sits in the job: rank, world size and local rank, discovered from the
// launcher's environment (OpenMPI, PMI, Slurm or torchrun-style variables). Nothing to set
// by hand under mpirun.
#pragma once
#include <string>

namespace ptrain {

struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;             // GPU index on this node
  std::string launcher = "none";  // "openmpi" | "pmi" | "slurm" | "torchrun" | "none"
  bool uses_mpi() const { return launcher == "openmpi" || launcher == "pmi"; }

  // Reads OMPI_COMM_WORLD_*, PMI_*, SLURM_* or RANK/WORLD_SIZE/LOCAL_RANK. Throws
  // UsageError when the variables are inconsistent (rank outside [0, world_size)).
  static DistEnv detect();
};

// The CPUs this process may run on (its affinity mask, which a launcher's binding or a
// container's cpuset narrows), at least 1.
int usable_cpus();

}  // namespace ptrain
