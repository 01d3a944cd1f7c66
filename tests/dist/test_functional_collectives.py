"""torch's functional collectives (``torch.distributed._functional_collectives``) under
mock_torch: every collective with list, DeviceMesh and (mesh, dim) groups, and the autograd
variants' gradients, unchanged on 2 Gloo ranks under torch's launcher on torch and under
holoflow's: every rank's answers equal torch's."""
import pytest
from test_dtensor_api import _compare, _run

import holoflow as flow
from holoflow.distributed_nn import _functional_collectives as funcol
from holoflow.dtensor import DeviceMesh

BODY = '''
import torch.distributed._functional_collectives as funcol
dist.init_process_group("gloo")
rank = dist.get_rank()
n = dist.get_world_size()
x = torch.arange(12.0).reshape(4, 3) + 100 * rank
OUT["all_reduce"] = [r6(funcol.all_reduce(x, "sum", list(range(n)))), r6(funcol.all_reduce(x, "max", list(range(n)))),
                     r6(funcol.all_reduce(x, "avg", list(range(n)))), r6(x)]
OUT["all_gather"] = [r6(funcol.all_gather_tensor(x, 0, list(range(n)))), list(funcol.all_gather_tensor(x, 1, list(range(n))).shape),
                     r6(funcol.wait_tensor(funcol.all_gather_tensor(x, 1, list(range(n)))))]
OUT["reduce_scatter"] = [r6(funcol.reduce_scatter_tensor(x, "sum", 0, list(range(n)))),
                         r6(funcol.reduce_scatter_tensor(x.repeat(1, 2), "sum", 1, list(range(n))))]
OUT["a2a"] = [r6(funcol.all_to_all_single(x, None, None, list(range(n)))),
              r6(funcol.all_to_all_single(x, [1, 3] if rank == 0 else [3, 1], [1, 3] if rank == 0 else [3, 1], list(range(n))))]
OUT["broadcast"] = r6(funcol.broadcast(x, 1, list(range(n))))
OUT["permute"] = r6(funcol.permute_tensor(x.reshape(-1), [1, 0], list(range(n))))   # (torch's takes 1-D tensors)
OUT["coalesced"] = [r6(t) for t in funcol.all_reduce_coalesced([x, x * 2], "sum", list(range(n)))]
mesh = init_device_mesh("cpu", (n,))
OUT["mesh_group"] = [r6(funcol.all_reduce(x, "sum", mesh)), r6(funcol.all_reduce(x, "sum", (mesh, 0)))]
# the autograd variants: gradients through the matching collectives
w = (torch.arange(6.0).reshape(2, 3) + rank).requires_grad_()
g = funcol.all_gather_tensor_autograd(w, 0, list(range(n)))
(g * torch.arange(g.numel(), dtype=torch.float32).reshape(g.shape)).sum().backward()
OUT["ag_grad"] = r6(w.grad)
v = (torch.arange(8.0).reshape(4, 2) * (rank + 1)).requires_grad_()
rs = funcol.reduce_scatter_tensor_autograd(v, "sum", 0, list(range(n)))
(rs * (rank + 2)).sum().backward()
OUT["rs"] = [r6(rs), r6(v.grad)]
u = (torch.arange(8.0).reshape(4, 2) + 10 * rank).requires_grad_()
a = funcol.all_to_all_single_autograd(u, None, None, list(range(n)))
(a * torch.arange(8.0).reshape(4, 2)).sum().backward()
OUT["a2a_grad"] = [r6(a), r6(u.grad)]
'''


def test_functional_collectives_script_equals_torch(tmp_path):
    _compare(_run(tmp_path, "holoflow", "funcol", BODY, 2), _run(tmp_path, "torch", "funcol", BODY, 2))


def test_functional_collectives_refuse_bad_arguments():
    """Each refusal comes before any communication (no world needed)."""
    x = flow.ones(3, 2)
    with pytest.raises(ValueError, match="reduceOp 'xor' is not one of"):
        funcol.all_reduce(x, "xor", [0, 1])
    with pytest.raises(ValueError, match="dim 0 of size 3 does not split into 2 equal pieces"):
        funcol.reduce_scatter_tensor(x, "sum", 0, [0, 1])
    with pytest.raises(ValueError, match=r"src_dst \[0, 0\] must be a permutation of 0..1"):
        funcol.permute_tensor(x, [0, 0], [0, 1])
    with pytest.raises(ValueError, match=r"a 2-D DeviceMesh names no single group; pass \(mesh, mesh_dim\)"):
        funcol.all_reduce(x, "sum", DeviceMesh("cpu", [[0], [1]]))
    assert funcol.AsyncCollectiveTensor(x) is x and funcol.wait_tensor(x) is x
