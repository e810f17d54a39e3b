"""L-BFGS with an optional strong-Wolfe line search, as torch.optim.LBFGS (one param group; step takes a closure).

The parameters are handled as one flat vector (numpy, in the parameters' dtype); the curvature history
(old_dirs, old_stps, ro, H_diag) and the last direction live in the state of the first parameter, as in torch.
"""
from __future__ import annotations

import numpy as np

from ..autograd.grad_mode import enable_grad, no_grad
from ..tensor import Tensor
from .optimizer import _as_pairs, Optimizer, as_float, check_hyper, raise_no_cuda


def _cubic_minimum(x1, f1, g1, x2, f2, g2, bounds=None):
    """The minimiser of the cubic through (x1, f1, g1) and (x2, f2, g2), clamped to bounds (default: [x1, x2])."""
    low, high = bounds if bounds is not None else (min(x1, x2), max(x1, x2))
    d1 = g1 + g2 - 3 * (f1 - f2) / (x1 - x2)
    d2_square = d1 * d1 - g1 * g2
    if d2_square < 0:
        return (low + high) / 2.0
    d2 = float(np.sqrt(d2_square))
    if x1 <= x2:
        pos = x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2))
    else:
        pos = x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2))
    return min(max(pos, low), high)


def _strong_wolfe(evaluate, t, d, f, g, gtd, c1=1e-4, c2=0.9, tolerance_change=1e-9, max_ls=25):
    """(loss, grad, step, evaluations) at a step along d meeting the strong Wolfe conditions (bracket, then zoom)."""
    d_norm = float(np.abs(d).max())
    f_new, g_new = evaluate(t)
    evals = 1
    gtd_new = float(g_new @ d)
    t_prev, f_prev, g_prev, gtd_prev = 0.0, f, g.copy(), gtd
    done = False
    it = 0
    bracket = bracket_f = bracket_g = bracket_gtd = None
    while it < max_ls:
        if f_new > f + c1 * t * gtd or (it > 1 and f_new >= f_prev):
            bracket, bracket_f, bracket_g = [t_prev, t], [f_prev, f_new], [g_prev, g_new.copy()]
            bracket_gtd = [gtd_prev, gtd_new]
            break
        if abs(gtd_new) <= -c2 * gtd:
            bracket, bracket_f, bracket_g = [t], [f_new], [g_new]
            done = True
            break
        if gtd_new >= 0:
            bracket, bracket_f, bracket_g = [t_prev, t], [f_prev, f_new], [g_prev, g_new.copy()]
            bracket_gtd = [gtd_prev, gtd_new]
            break
        bounds = (t + 0.01 * (t - t_prev), t * 10)
        t_prev, t = t, _cubic_minimum(t_prev, f_prev, gtd_prev, t, f_new, gtd_new, bounds)
        f_prev, g_prev, gtd_prev = f_new, g_new.copy(), gtd_new
        f_new, g_new = evaluate(t)
        evals += 1
        gtd_new = float(g_new @ d)
        it += 1
    if it == max_ls:
        bracket, bracket_f, bracket_g = [0, t], [f, f_new], [g, g_new]
    insufficient = False
    low, high = (0, 1) if bracket_f[0] <= bracket_f[-1] else (1, 0)
    while not done and it < max_ls:
        if abs(bracket[1] - bracket[0]) * d_norm < tolerance_change:
            break
        t = _cubic_minimum(bracket[0], bracket_f[0], bracket_gtd[0], bracket[1], bracket_f[1], bracket_gtd[1])
        top, bottom = max(bracket), min(bracket)
        eps = 0.1 * (top - bottom)
        if min(top - t, t - bottom) < eps:
            if insufficient or t >= top or t <= bottom:
                t = top - eps if abs(t - top) < abs(t - bottom) else bottom + eps
                insufficient = False
            else:
                insufficient = True
        else:
            insufficient = False
        f_new, g_new = evaluate(t)
        evals += 1
        gtd_new = float(g_new @ d)
        it += 1
        if f_new > f + c1 * t * gtd or f_new >= bracket_f[low]:
            bracket[high], bracket_f[high], bracket_g[high], bracket_gtd[high] = t, f_new, g_new.copy(), gtd_new
            low, high = (0, 1) if bracket_f[0] <= bracket_f[1] else (1, 0)
        else:
            if abs(gtd_new) <= -c2 * gtd:
                done = True
            elif gtd_new * (bracket[high] - bracket[low]) >= 0:
                bracket[high], bracket_f[high] = bracket[low], bracket_f[low]
                bracket_g[high], bracket_gtd[high] = bracket_g[low], bracket_gtd[low]
            bracket[low], bracket_f[low], bracket_g[low], bracket_gtd[low] = t, f_new, g_new.copy(), gtd_new
    return bracket_f[low], bracket_g[low], bracket[low], evals


def _tensor(a) -> Tensor:
    return Tensor._from_array(np.array(a))


def _array(v):
    return v._data if isinstance(v, Tensor) else v


class LBFGS(Optimizer):
    """Limited-memory BFGS: up to max_iter quasi-Newton iterations per step(closure)."""

    def __init__(self, params, lr=1, max_iter=20, max_eval=None, tolerance_grad=1e-7, tolerance_change=1e-9,
                 history_size=100, line_search_fn=None) -> None:
        check_hyper(as_float(lr) >= 0.0, f"Invalid learning rate: {lr}")
        if max_eval is None:
            max_eval = max_iter * 5 // 4
        defaults = {"lr": lr, "max_iter": max_iter, "max_eval": max_eval, "tolerance_grad": tolerance_grad,
                    "tolerance_change": tolerance_change, "history_size": history_size,
                    "line_search_fn": line_search_fn}
        super().__init__(params, defaults)
        if len(self.param_groups) != 1:
            raise ValueError("LBFGS doesn't support per-parameter options (parameter groups)")
        self._params = self.param_groups[0]["params"]

    # NOTE: a complex parameter takes part as the float pairs of its real and imaginary parts, as in torch
    def _flat_grad(self) -> np.ndarray:
        parts = [np.zeros(_real_parts(p._data).size, _real_parts(p._data).dtype) if p._grad is None
                 else _real_parts(p._grad._data).reshape(-1) for p in self._params]
        return np.concatenate(parts) if parts else np.zeros(0)

    def _add(self, step, update) -> None:
        offset = 0
        for p in self._params:
            data = _real_parts(p._data)
            n = data.size
            data += (step * update[offset:offset + n]).reshape(data.shape).astype(data.dtype, copy=False)
            p._bump_version()
            offset += n

    def _set(self, values) -> None:
        for p, v in zip(self._params, values):
            p._data[...] = v
            p._bump_version()

    def step(self, closure=None):
        """Run the iterations; closure() must zero the gradients, compute the loss, backward, and return it."""
        if closure is None:
            raise RuntimeError("LBFGS.step needs a closure that reevaluates the model and returns the loss")
        if any(p.is_cuda for p in self._params):
            raise_no_cuda(self)
        with no_grad():
            return self._step(closure)

    def _evaluate(self, closure):
        with enable_grad():
            loss = closure()
        return loss

    def _step(self, closure):
        group = self.param_groups[0]
        lr, max_iter, max_eval = as_float(group["lr"]), group["max_iter"], group["max_eval"]
        tol_grad, tol_change = group["tolerance_grad"], group["tolerance_change"]
        line_search, history = group["line_search_fn"], group["history_size"]
        state = self.state[self._params[0]]
        state.setdefault("func_evals", 0)
        state.setdefault("n_iter", 0)
        orig_loss = self._evaluate(closure)
        loss = float(orig_loss)
        evals = 1
        state["func_evals"] += 1
        flat_grad = self._flat_grad()
        if np.abs(flat_grad).max() <= tol_grad:
            return orig_loss
        d, t = _array(state.get("d")), state.get("t")
        old_dirs = [_array(v) for v in state.get("old_dirs", [])]
        old_stps = [_array(v) for v in state.get("old_stps", [])]
        ro = [float(_array(v)) for v in state.get("ro", [])]
        h_diag = state.get("H_diag")
        h_diag = float(_array(h_diag)) if h_diag is not None else None
        prev_grad, prev_loss = _array(state.get("prev_flat_grad")), state.get("prev_loss")
        t = float(_array(t)) if t is not None else None
        iteration = 0
        while iteration < max_iter:
            iteration += 1
            state["n_iter"] += 1
            if state["n_iter"] == 1:
                d = -flat_grad
                old_dirs, old_stps, ro, h_diag = [], [], [], 1.0
            else:
                y = flat_grad - prev_grad
                s = d * t
                ys = float(y @ s)
                if ys > 1e-10:
                    if len(old_dirs) == history:
                        old_dirs.pop(0)
                        old_stps.pop(0)
                        ro.pop(0)
                    old_dirs.append(y)
                    old_stps.append(s)
                    ro.append(1.0 / ys)
                    h_diag = ys / float(y @ y)
                al = [0.0] * len(old_dirs)
                q = -flat_grad
                for i in range(len(old_dirs) - 1, -1, -1):
                    al[i] = float(old_stps[i] @ q) * ro[i]
                    q = q - al[i] * old_dirs[i]
                d = r = q * h_diag
                for i in range(len(old_dirs)):
                    be_i = float(old_dirs[i] @ r) * ro[i]
                    r += (al[i] - be_i) * old_stps[i]
                state["al"] = [_tensor(a) for a in al] + [None] * (history - len(al))
            prev_grad = flat_grad.copy()
            prev_loss = loss
            t = min(1.0, 1.0 / float(np.abs(flat_grad).sum())) * lr if state["n_iter"] == 1 else lr
            gtd = float(flat_grad @ d)
            if gtd > -tol_change:
                break
            step_evals = 0
            if line_search is not None:
                if line_search != "strong_wolfe":
                    raise RuntimeError("only 'strong_wolfe' is supported")
                start = [p._data.copy() for p in self._params]

                def evaluate(step, d=d, start=start):
                    self._add(step, d)
                    value = float(self._evaluate(closure))
                    grad = self._flat_grad().copy()
                    self._set(start)
                    return value, grad

                loss, flat_grad, t, step_evals = _strong_wolfe(evaluate, t, d, loss, flat_grad, gtd,
                                                               max_ls=max_eval - evals)
                self._add(t, d)
                converged = np.abs(flat_grad).max() <= tol_grad
            else:
                self._add(t, d)
                converged = False
                if iteration != max_iter:
                    loss = float(self._evaluate(closure))
                    flat_grad = self._flat_grad()
                    converged = np.abs(flat_grad).max() <= tol_grad
                    step_evals = 1
            evals += step_evals
            state["func_evals"] += step_evals
            if iteration == max_iter or evals >= max_eval or converged:
                break
            if np.abs(d * t).max() <= tol_change or abs(loss - prev_loss) < tol_change:
                break
        state["d"] = _tensor(d)
        state["t"] = t
        state["old_dirs"] = [_tensor(v) for v in old_dirs]
        state["old_stps"] = [_tensor(v) for v in old_stps]
        state["ro"] = [_tensor(v) for v in ro]
        state["H_diag"] = h_diag
        state["prev_flat_grad"] = _tensor(prev_grad)
        state["prev_loss"] = prev_loss
        return orig_loss


def _real_parts(values: np.ndarray) -> np.ndarray:
    """A complex array as its float pairs (optimizer._as_pairs); any other array itself."""
    return _as_pairs(values) if values.dtype.kind == "c" else values
