#pragma once

/// The umbrella header: everything public in troupe.
#include "troupe/checkpoint.hpp"
#include "troupe/device.hpp"
#include "troupe/dtype.hpp"
#include "troupe/errors.hpp"
#include "troupe/runtime.hpp"
#include "troupe/tensor.hpp"
#include "troupe/variable.hpp"
#include "troupe/data/dataset.hpp"
#include "troupe/data/readers.hpp"
#include "troupe/distribute/cluster_resolver.hpp"
#include "troupe/distribute/context.hpp"
#include "troupe/distribute/cross_device_ops.hpp"
#include "troupe/distribute/mirrored_strategy.hpp"
#include "troupe/distribute/per_replica.hpp"
#include "troupe/distribute/reduce_op.hpp"
#include "troupe/distribute/strategy.hpp"
