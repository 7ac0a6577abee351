// The cuDNN graph helpers of kernels/cuda/cudnn_graph.h: building a plan and running it.
#include "kernels/cuda/cudnn_graph.h"

#include <cuda_runtime_api.h>

#include "core/cuda_stream.h"
#include "kernels/autotune.h"
#include "kernels/cuda/autotune_cuda.h"

namespace octet::kernels::cuda::cudnn {

std::unique_ptr<Plan> build_plan(cudnnHandle_t handle, GraphBuilder& builder, std::string& why_not,
                                 cudaStream_t stream, const PlanTrial& trial, const std::function<std::string()>& what) {
  const bool tune = autotune_enabled() && trial;
  // Set while autotuning times the candidates. A candidate cuDNN refuses comes back as a false trial;
  // an error thrown there is the GPU's (a sticky CUDA error, a failed event), not a refusal, and must
  // reach the caller rather than be cached as "no plan", which would run this shape unfused from then
  // on and leave the error to surface in some later, unrelated op.
  bool timing = false;
  try {
    Descriptor graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
    graph.set(ATTR(CUDNN_ATTR_OPERATIONGRAPH_HANDLE), CUDNN_TYPE_HANDLE, 1, &handle);
    const auto& ops = builder.operations();
    graph.set(ATTR(CUDNN_ATTR_OPERATIONGRAPH_OPS), CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(ops.size()),
              ops.data());
    graph.finalize();
    std::string last_failure = "the heuristics returned no engine configuration";
    for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
      Descriptor heuristics(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "engine heuristics");
      heuristics.set_descriptor(ATTR(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH), graph.get());
      heuristics.set(ATTR(CUDNN_ATTR_ENGINEHEUR_MODE), CUDNN_TYPE_HEUR_MODE, 1, &mode);
      heuristics.finalize();
      int64_t available = 0;
      check(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                     &available, nullptr),
            "cudnnBackendGetAttribute", "engine heuristics CUDNN_ATTR_ENGINEHEUR_RESULTS (count)");
      if (available <= 0) continue;
      std::vector<Descriptor> configs;
      std::vector<cudnnBackendDescriptor_t> raw_configs;
      for (int64_t i = 0; i < available; ++i) {
        configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine config");
        raw_configs.push_back(configs.back().get());
      }
      int64_t returned = 0;
      check(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                     available, &returned, raw_configs.data()),
            "cudnnBackendGetAttribute", "engine heuristics CUDNN_ATTR_ENGINEHEUR_RESULTS");
      // The plans that finalize, in the heuristics' order, each with its engine config's index: the
      // first one, or while tuning up to kAutotuneCandidates.
      std::vector<std::unique_ptr<Plan>> candidates;
      std::vector<int64_t> config_of;
      for (int64_t i = 0; i < returned && i < available; ++i) {
        auto candidate = std::make_unique<Descriptor>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "execution plan");
        candidate->set(ATTR(CUDNN_ATTR_EXECUTION_PLAN_HANDLE), CUDNN_TYPE_HANDLE, 1, &handle);
        candidate->set_descriptor(ATTR(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG), raw_configs[i]);
        const cudnnStatus_t status = cudnnBackendFinalize(candidate->get());
        if (status != CUDNN_STATUS_SUCCESS) {  // this engine cannot run the graph; try the next one
          last_failure = "cudnnBackendFinalize on an execution plan failed: " + cudnn_message(status);
          continue;
        }
        auto plan = std::make_unique<Plan>();
        int64_t returned_sizes = 0;
        check(cudnnBackendGetAttribute(candidate->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                       &returned_sizes, &plan->workspace_bytes),
              "cudnnBackendGetAttribute", "execution plan CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE");
        plan->execution_plan = std::move(candidate);
        plan->heuristics_first = candidates.empty();
        candidates.push_back(std::move(plan));
        config_of.push_back(i);
        if (!tune || static_cast<int>(candidates.size()) == kAutotuneCandidates) break;
      }
      if (candidates.empty()) continue;
      int pick = 0;
      if (tune) {
        timing = true;
        pick = time_candidates(
            stream, static_cast<int>(candidates.size()), [&](int i) { return trial(*candidates[i]); },
            "cuDNN engine configuration", what);
        timing = false;
        if (pick < 0) {  // every candidate refused to run: the next list, as for plans that do not finalize
          last_failure = "cuDNN ran none of the " + std::to_string(candidates.size()) +
                         " engine configurations it offered for this attention graph";
          continue;
        }
      }
      std::unique_ptr<Plan> plan = std::move(candidates[pick]);
      plan->graph_parts = builder.take_descriptors();
      plan->graph_parts.push_back(std::move(graph));
      plan->graph_parts.push_back(std::move(configs[config_of[pick]]));
      return plan;
    }
    why_not = "cuDNN has no engine for this attention graph: " + last_failure;
  } catch (const Error& e) {
    if (timing) throw;
    why_not = e.what();
  }
  return nullptr;
}

void execute(cudnnHandle_t handle, const Plan& plan, const std::vector<int64_t>& uids, const std::vector<void*>& pointers,
             const Tensor& like, const char* op) {
  const cudaStream_t stream = octet::cuda::current_stream(like.device().index);
  // Workspace from the stream-ordered pool: freed at the end of this call, reused by the next.
  Tensor workspace;
  void* workspace_ptr = nullptr;
  if (plan.workspace_bytes > 0) {
    workspace = empty({plan.workspace_bytes}, DType::u8, like.device());
    workspace_ptr = workspace.data_ptr();
  }
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, std::string(op) + " variant pack");
  pack.set(ATTR(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS), CUDNN_TYPE_INT64, static_cast<int64_t>(uids.size()), uids.data());
  pack.set(ATTR(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS), CUDNN_TYPE_VOID_PTR, static_cast<int64_t>(pointers.size()),
           pointers.data());
  pack.set(ATTR(CUDNN_ATTR_VARIANT_PACK_WORKSPACE), CUDNN_TYPE_VOID_PTR, 1, &workspace_ptr);
  pack.finalize();
  check(cudnnSetStream(handle, stream), "cudnnSetStream", op);
  check(cudnnBackendExecute(handle, plan.execution_plan->get(), pack.get()), "cudnnBackendExecute", op);
}

}  // namespace octet::kernels::cuda::cudnn
