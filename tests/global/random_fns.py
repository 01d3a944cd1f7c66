"""Random ops on global tensors, run on every rank (simulated threads or a Gloo world): each
function returns this rank's shards as numpy arrays, keyed by case, for test_random_global.py."""
import holoflow as flow
import holoflow.nn.functional as F
from holoflow.sbp import B, P, S


def _inplace(method: str, *args):
    def run(x, rank):
        y = x.clone()
        getattr(y, method)(*args)
        return y
    return run


# name -> a draw on a global tensor of ones (``rank``: a user generator seeded apart per rank)
DRAWS = {
    "dropout": lambda x, rank: F.dropout(x, 0.5),
    "bernoulli": lambda x, rank: flow.bernoulli(x * 0.5),
    "bernoulli_generator": lambda x, rank: flow.bernoulli(x * 0.5, generator=flow.Generator().manual_seed(rank)),
    "normal_": _inplace("normal_"),
    "uniform_": _inplace("uniform_"),
    "exponential_": _inplace("exponential_"),
    "random_": _inplace("random_", 0, 1000),
    "bernoulli_": _inplace("bernoulli_", 0.5),
    "rand_like": lambda x, rank: flow.rand_like(x),
    "randn_like": lambda x, rank: flow.randn_like(x),
    "randint_like": lambda x, rank: flow.randint_like(x, 1000),
    "poisson": lambda x, rank: flow.poisson(x * 3),
    "binomial": lambda x, rank: flow.binomial(x * 20, x * 0.5),
    "rrelu": lambda x, rank: F.rrelu(x - 2, training=True),
    "cauchy_": _inplace("cauchy_"),
    "log_normal_": _inplace("log_normal_"),
    "geometric_": _inplace("geometric_", 0.3),
}


def eager_draws(rank: int, ranks, nds, seed: int | None = None) -> dict:
    """Every draw of ``DRAWS`` on a (64, 32) global tensor of ones under each nd-SBP of ``nds``
    (plus attention dropout and multinomial), with autograd through dropout: ``{(name, nd):
    local array}``. ``seed``: every rank seeds alike; None: each rank seeds with its rank."""
    flow.manual_seed(rank if seed is None else seed)
    place = flow.placement("cpu", ranks)
    out = {}
    for nd in nds:
        x = flow.ones(64, 32, placement=place, sbp=nd)
        for name, fn in DRAWS.items():
            out[(name, nd)] = fn(x, rank).to_local().numpy()
        leaf = flow.ones(64, 32, placement=place, sbp=nd, requires_grad=True)
        y = F.dropout(leaf, 0.5)
        y.sum().backward()
        out[("dropout_grad", nd)] = (y.detach().to_local().numpy(), leaf.grad.to_local().numpy())
        if all(s == B or s == S(0) for s in nd):
            out[("multinomial", nd)] = flow.multinomial(x, 8, replacement=True).to_local().numpy()
            q = flow.ones(8, 2, 16, 8, placement=place, sbp=nd)
            out[("attention_dropout", nd)] = F.scaled_dot_product_attention(q, q * 2, q, dropout_p=0.5) \
                .to_local().numpy()
    return out


def partial_input(rank: int, ranks) -> str:
    """rand_like of a partial-sum tensor: a constant, so broadcast (the values agree)."""
    flow.manual_seed(rank)
    place = flow.placement("cpu", ranks)
    x = flow.ones(8, 4, placement=place, sbp=B).to_global(sbp=P)
    y = flow.rand_like(x)
    return str(tuple(y.sbp)), y.to_local().numpy()


def graph_draws(rank: int, ranks, nd, steps: int = 3, seed: int | None = None) -> list:
    """A global nn.Graph with dropout (and the in-place sampler) run ``steps`` times: this rank's
    output shards per step."""
    flow.manual_seed(rank if seed is None else seed)
    place = flow.placement("cpu", ranks)
    x = flow.ones(64, 32, placement=place, sbp=nd)

    class Drop(flow.nn.Graph):
        def build(self, x):
            y = F.dropout(x * 2.0, 0.5)
            return y, flow.rand_like(x)
    g = Drop()
    return [tuple(t.to_local().numpy() for t in g(x)) for _ in range(steps)]


def pipeline_losses(rank: int, init: dict, steps: int = 2) -> list:
    """Two pipeline stages of two ranks each ([0, 1], [2, 3]), the batch broadcast on each stage's
    ranks, dropout in both stages, two micro-batches: this rank's losses (stage 1's ranks)."""
    from pipeline_fns import Net, data

    p0, p1 = flow.placement("cpu", ranks=[0, 1]), flow.placement("cpu", ranks=[2, 3])
    net = Net(p0=p0, p1=p1, sbp=[B], init=init)
    opt = flow.optim.SGD(net.parameters(), lr=0.1)

    class G(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.net = net
            self.net.s0.config.set_stage(0, p0)
            self.net.s1.config.set_stage(1, p1)
            self.config.set_gradient_accumulation_steps(2)
            self.add_optimizer(opt)

        def build(self, x, y):
            h = F.dropout(self.net.s0(x), 0.5).to_global(placement=p1, sbp=[B])
            loss = F.cross_entropy(F.dropout(self.net.s1(h), 0.5), y)
            loss.backward()
            return loss

    g = G()
    losses = []
    for s in range(steps):
        x, y = data(16, s)
        loss = g(flow.tensor(x).to_global(placement=p0, sbp=[B]), flow.tensor(y).to_global(placement=p1, sbp=[B]))
        if rank in p1.flat_ranks:
            losses.append(loss.to_local().numpy().copy())
    return losses
