"""OneFlow's documented pipeline-parallel example ("Pipelining Parallelism"), as written, with
``cpu`` for ``cuda``: two stages on ranks 0 and 1, two micro-batches per step, 1F1B.

Run with::

    python -m holoflow.distributed.launch --nproc_per_node 2 -m holoflow.examples.pipeline [--trace t.json] [--predict]

``--trace`` writes one Perfetto trace of both ranks (open it at https://ui.perfetto.dev);
``--predict`` prints the cost model's step before training (``graph.predict``: each stage's
kernels timed on example inputs, the schedule simulated; nothing runs).
"""
import argparse

import holoflow as flow

BATCH_SIZE = 16
BROADCAST = [flow.sbp.broadcast]
P0 = flow.placement("cpu", ranks=[0])
P1 = flow.placement("cpu", ranks=[1])


class Stage0Module(flow.nn.Module):
    def __init__(self):
        super().__init__()
        self.flatten = flow.nn.Flatten()
        self.linear0 = flow.nn.Linear(28 * 28, 512)
        self.relu0 = flow.nn.ReLU()

    def forward(self, x):
        out = self.flatten(x)
        out = self.linear0(out)
        out = self.relu0(out)
        return out


class Stage1Module(flow.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear1 = flow.nn.Linear(512, 512)
        self.relu1 = flow.nn.ReLU()
        self.linear2 = flow.nn.Linear(512, 10)
        self.relu2 = flow.nn.ReLU()

    def forward(self, x):
        out = self.linear1(x)
        out = self.relu1(out)
        out = self.linear2(out)
        out = self.relu2(out)
        return out


class PipelineModule(flow.nn.Module):
    def __init__(self):
        super().__init__()
        self.m_stage0 = Stage0Module()
        self.m_stage1 = Stage1Module()

        self.m_stage0.to_global(placement=P0, sbp=BROADCAST)
        self.m_stage1.to_global(placement=P1, sbp=BROADCAST)

    def forward(self, x):
        out_stage0 = self.m_stage0(x)
        in_stage1 = out_stage0.to_global(placement=P1, sbp=BROADCAST)
        out_stage1 = self.m_stage1(in_stage1)
        return out_stage1


def main(iterations: int = 20, trace: str | None = None, verbose: bool = True, predict: bool = False) -> list:
    """Trains 20 iterations; returns the losses (each the mean of the step's micro-batch losses)
    on the rank holding them (rank 1), an empty list elsewhere."""
    module_pipeline = PipelineModule()
    sgd = flow.optim.SGD(module_pipeline.parameters(), lr=0.001)

    class PipelineGraph(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.module_pipeline = module_pipeline
            self.module_pipeline.m_stage0.to(flow.nn.graph.GraphModule).set_stage(stage_id=0, placement=P0)
            self.module_pipeline.m_stage1.to(flow.nn.graph.GraphModule).set_stage(stage_id=1, placement=P1)
            self.loss_fn = flow.nn.CrossEntropyLoss()
            self.config.set_gradient_accumulation_steps(2)
            self.add_optimizer(sgd)

        def build(self, x, y):
            out = self.module_pipeline(x)
            loss = self.loss_fn(out, y)
            loss.backward()
            return loss

    graph_pipeline = PipelineGraph()

    x = flow.randn(BATCH_SIZE, 1, 28, 28)
    x = x.to_global(P0, BROADCAST)
    y = flow.randint(0, 10, (BATCH_SIZE,))
    y = y.to_global(P1, BROADCAST)

    if predict:   # each rank times its stage's kernels; the figures are agreed by the ranks
        from holoflow.graph.cost_model import DeviceModel
        q = graph_pipeline.predict(x, y, device=DeviceModel.calibrate(flow.device("cpu"), (0, 1)))
        if flow.env.get_rank() == 0:
            print(f"predicted before the first step: {q}")
    losses = []
    for i in range(iterations):
        loss = graph_pipeline(x, y)
        if flow.env.get_rank() in P1.ranks:    # the loss lives on stage 1's rank
            losses.append(float(loss.to_local().mean()))
            if verbose:
                print(f"iteration {i}: loss {losses[-1]:.4f} (micro-batch losses {loss.to_local().tolist()})")
    if trace:
        graph_pipeline.write_trace(trace)
    return losses


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--trace", default=None, help="write one Perfetto trace of both ranks here")
    ap.add_argument("--predict", action="store_true", help="print the cost model's step before training")
    args = ap.parse_args()
    main(args.iterations, args.trace, predict=args.predict)
