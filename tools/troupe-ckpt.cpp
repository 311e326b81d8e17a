// troupe-ckpt: prints what troupe checkpoint files hold (step, variables, dtypes, shapes, sizes)
// and whether each tensor matches its checksum. Exit status: 0 when every file is intact, 1 when
// one is damaged or unreadable (the reason on stderr), 2 for a usage error.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "troupe/checkpoint.hpp"

namespace {

void usage(std::ostream& out) {
  out << "usage: troupe-ckpt FILE.ckpt...\n"
         "Prints each checkpoint's step and variables (name, dtype, shape, bytes) and checks every\n"
         "tensor against its checksum. Exits 1 when a file is damaged or unreadable.\n";
}

// Prints one file; returns whether it is intact.
bool inspect(const std::string& path) {
  troupe::CheckpointInfo info;
  try {
    info = troupe::inspect_checkpoint(path);
  } catch (const troupe::CheckpointError& e) {
    std::cerr << "troupe-ckpt: " << e.what() << "\n";
    return false;
  }
  std::size_t bad = 0;
  for (const auto& e : info.entries) bad += e.checksum_ok ? 0 : 1;
  std::cout << path << ": step " << info.step << ", " << info.entries.size() << " variables, " << info.file_bytes
            << " bytes\n";
  std::size_t width = 4;
  for (const auto& e : info.entries) width = std::max(width, e.name.size());
  for (const auto& e : info.entries) {
    std::string line = "  " + e.name + std::string(width - e.name.size() + 2, ' ');
    std::string dtype(troupe::dtype_name(e.dtype));
    line += dtype + std::string(dtype.size() < 9 ? 9 - dtype.size() : 1, ' ');
    std::string shape = troupe::shape_to_string(e.shape);
    line += shape + std::string(shape.size() < 16 ? 16 - shape.size() : 1, ' ');
    line += std::to_string(e.nbytes) + " bytes  " + (e.checksum_ok ? "ok" : "CHECKSUM MISMATCH");
    std::cout << line << "\n";
  }
  if (bad > 0) {
    std::cerr << "troupe-ckpt: checkpoint " << path << ": " << bad << " of " << info.entries.size()
              << " tensors fail their checksum\n";
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      usage(std::cout);
      return 0;
    }
    if (!arg.empty() && arg[0] == '-') {
      std::cerr << "troupe-ckpt: unknown option " << arg << "\n";
      usage(std::cerr);
      return 2;
    }
    files.push_back(arg);
  }
  if (files.empty()) {
    usage(std::cerr);
    return 2;
  }
  bool intact = true;
  for (const std::string& f : files) intact = inspect(f) && intact;
  return intact ? 0 : 1;
}
