// What both runners share: the front end's sparse options as a sparse/ PolicyConfig.
#include "engine/step_runner.h"

namespace dhs {

PolicyConfig policy_config(const EngineOptions& o) {
  PolicyConfig pc;
  pc.name = o.sparse_policy;
  pc.gamma = o.gamma;
  pc.budget = o.budget;
  pc.dense_below = o.dense_below;
  return pc;
}

}  // namespace dhs
