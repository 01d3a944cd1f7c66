/* The eager per-op path and the backward loop in C (built by setup.py, optional).
 *
 * core/dispatch.py's ``_eager`` and core/autograd.py's ``_drain`` are the reference; this file
 * does what they do for the common cases, and hands every other case to them:
 *
 * - ``apply`` / ``eager``: an op whose tensor inputs are local runs its kernel on the storages;
 *   the result is wrapped (one tensor, or several: a multi-output op's named tuple), a grad node is
 *   recorded (edges, shapes, dtypes, what the rule reads with its storage versions), and a view
 *   op's results that alias input 0 are marked as views of its base. Handed to Python before the
 *   kernel runs: a global input, a view input whose base moved on or a written piece of a
 *   multi-output view, a view under a tracer (an interpreter that tracks values); saved-tensor
 *   hooks and anomaly mode call the Python helpers the reference calls.
 * - ``binary_method``: Tensor's ``__mul__`` and friends as one C call.
 * - ``drain``: ready nodes run their rules, the one made last first, and their gradients are
 *   summed into buffers and leaves; nodes with hooks, retained gradients or packed saved tensors,
 *   or whose rule reads zeros for a missing output gradient, run through ``autograd._run_node``.
 *
 * Nothing here knows an op: it reads the fields every Op has. Tensor, GradNode and ViewInfo keep
 * their fields in ``__slots__``; their offsets are read once from the classes' member
 * descriptors (``init`` refuses classes whose fields are not plain slots).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

/* -- what init() hands over ------------------------------------------------------------------ */
static PyTypeObject *Tensor_T, *Node_T, *TorchTensor_T, *ViewInfo_T;
static PyObject *py_eager;          /* dispatch._eager_py: the reference path */
static PyObject *py_wrap;           /* dispatch.wrap */
static PyObject *py_op_error;       /* dispatch.op_error */
static PyObject *current_var;       /* interpret._CURRENT (a ContextVar) */
static PyObject *grad_state;        /* grad_mode.STATE (threading.local) */
static PyObject *anomaly_state;     /* anomaly.ANOMALY */
static PyObject *live_hooks;        /* saved._LIVE: a one-element list */
static PyObject *float_dtypes;      /* dict: torch dtype -> bool (floating point or complex) */
static PyObject *zero;              /* 0, a new tensor's _out_idx */
static PyObject *seq_counter;       /* node.SEQ (an itertools.count): a new node's creation number */

/* field offsets */
static Py_ssize_t T_data, T_rg, T_grad, T_grad_fn, T_out_idx, T_hooks, T_global;
static Py_ssize_t V_base, V_chain, V_stamp, V_nograd, V_version, V_at;
static Py_ssize_t N_op, N_edges, N_attrs, N_shapes, N_dtypes, N_saved, N_versions, N_outs,
    N_out_metas, N_hooks, N_retains, N_seq;

/* interned attribute names */
static PyObject *s_kernel, *s_grad, *s_view, *s_saves, *s_saved_inputs, *s_saved_outputs,
    *s_shape, *s_dtype, *s__version, *s__view, *s_enabled, *s_bind, *s_saved_of,
    *s_save, *s__kept, *s_is_floating_point, *s_is_complex, *s__base;
static PyObject *py_note_forward;
static PyObject *s_inference, *s__inference, *s_name;
/* inference mode was entered in this process (note_inference): tensors an op makes there are
 * inference tensors (``_inference`` in their instance dict), which autograd refuses to save */
static int inference_made = 0;

#define SLOT(o, off) (*(PyObject **)((char *)(o) + (off)))

static inline PyObject *get_slot(PyObject *o, Py_ssize_t off) {
    PyObject *v = SLOT(o, off);
    return v ? v : Py_None;   /* (an unset slot reads as None: every field is set at creation) */
}

static inline void set_slot(PyObject *o, Py_ssize_t off, PyObject *v) {
    PyObject *old = SLOT(o, off);
    Py_INCREF(v);
    SLOT(o, off) = v;
    Py_XDECREF(old);
}

static int slot_offset(PyTypeObject *t, const char *name, Py_ssize_t *out) {
    PyObject *d = PyDict_GetItemString(t->tp_dict, name);   /* borrowed */
    if (d == NULL || Py_TYPE(d) != &PyMemberDescr_Type) {
        PyErr_Format(PyExc_TypeError, "holoflow._fast: %s.%s is not a slot", t->tp_name, name);
        return -1;
    }
    PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
    if (m->type != T_OBJECT_EX && m->type != T_OBJECT) {
        PyErr_Format(PyExc_TypeError, "holoflow._fast: %s.%s is not an object slot", t->tp_name, name);
        return -1;
    }
    *out = m->offset;
    return 0;
}

/* truth of an attribute, -1 on error */
static inline int attr_true(PyObject *o, PyObject *name) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL)
        return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* a view's ViewInfo (borrowed; its instance dict holds ``_view``, the class attribute is None),
 * Py_None for the others, NULL on error */
static inline PyObject *view_info(PyObject *x) {
    Py_ssize_t off = Py_TYPE(x)->tp_dictoffset;
    if (off <= 0) {   /* (not Tensor's own layout: asked the slow way) */
        PyObject *v = PyObject_GetAttr(x, s__view);
        if (v == NULL)
            return NULL;
        Py_DECREF(v);   /* (held by the instance or its class) */
        return v;
    }
    PyObject *dict = *(PyObject **)((char *)x + off);
    if (dict == NULL)
        return Py_None;
    PyObject *v = PyDict_GetItemWithError(dict, s__view);
    if (v == NULL)
        return PyErr_Occurred() ? NULL : Py_None;
    return v;
}

/* whether a view's base moved on since the view was derived (dispatch.refresh's test, eager:
 * the stamp's token is None), -1 on error */
static int stale(PyObject *vi) {
    PyObject *st = get_slot(vi, V_stamp), *b = get_slot(vi, V_base);
    if (!PyTuple_Check(st) || PyTuple_GET_SIZE(st) != 3 || !PyObject_TypeCheck(b, Tensor_T))
        return 1;   /* (the Python path looks) */
    if (get_slot(b, T_grad_fn) != PyTuple_GET_ITEM(st, 0) || PyTuple_GET_ITEM(st, 2) != Py_None)
        return 1;
    int same = PyObject_RichCompareBool(get_slot(b, T_out_idx), PyTuple_GET_ITEM(st, 1), Py_EQ);
    return same < 0 ? -1 : !same;
}

/* whether a view's storage was written since its history was derived, its base's history
 * unchanged (dispatch.written_since: a write under no_grad), -1 on error */
static int written_since(PyObject *x, PyObject *vi) {
    PyObject *now = PyObject_GetAttr(get_slot(x, T_data), s__version);
    if (now == NULL)
        return -1;
    int same = PyObject_RichCompareBool(now, get_slot(vi, V_at), Py_EQ);
    Py_DECREF(now);
    return same < 0 ? -1 : !same;
}

/* whether a kernel's result takes a gradient: floating point or complex (cached per dtype) */
static int takes_grad(PyObject *out) {
    PyObject *dt = PyObject_GetAttr(out, s_dtype);
    if (dt == NULL)
        return -1;
    PyObject *known = PyDict_GetItemWithError(float_dtypes, dt);
    if (known != NULL) {
        Py_DECREF(dt);
        return known == Py_True;
    }
    if (PyErr_Occurred()) {
        Py_DECREF(dt);
        return -1;
    }
    int f = attr_true(dt, s_is_floating_point);
    int c = f == 0 ? attr_true(dt, s_is_complex) : 0;
    if (f < 0 || c < 0 || PyDict_SetItem(float_dtypes, dt, (f || c) ? Py_True : Py_False) < 0) {
        Py_DECREF(dt);
        return -1;
    }
    Py_DECREF(dt);
    return f || c;
}

/* a new instance of ``type`` (one of the slotted classes init() took) with ``n`` fields set */
static PyObject *alloc_with(PyTypeObject *type, const Py_ssize_t *offs, PyObject *const *vals, int n) {
    PyObject *o = type->tp_alloc(type, 0);
    for (int i = 0; o != NULL && i < n; i++)
        set_slot(o, offs[i], vals[i]);
    return o;
}

static PyObject *new_tensor(PyObject *data) {
    const Py_ssize_t offs[] = {T_data, T_rg, T_grad, T_grad_fn, T_out_idx, T_hooks, T_global};
    PyObject *const vals[] = {data, Py_False, Py_None, Py_None, zero, Py_None, Py_None};
    return alloc_with(Tensor_T, offs, vals, 7);
}

/* -- inference tensors (grad_mode.inference_mode, tensor.is_inference_tensor) ----------------- */

/* marks ``t``, made by an op, an inference tensor where inference mode is on (grad mode is off
 * there: nothing to ask while it is on, or before inference mode was ever entered) */
static int mark_inference(PyObject *t, int grad_on) {
    if (grad_on || !inference_made)
        return 0;
    int on = attr_true(grad_state, s_inference);
    return on <= 0 ? on : PyObject_SetAttr(t, s__inference, Py_True);
}

/* whether ``x`` is an inference tensor: a view by its base's making, others by their own (saves
 * under holoflow.func's forward mode go through its saved-tensor hooks: GradNode.save decides) */
static int is_inference(PyObject *x) {
    PyObject *vi = view_info(x);
    if (vi == NULL)
        return -1;
    if (vi != Py_None)
        x = get_slot(vi, V_base);
    PyObject **dict = _PyObject_GetDictPtr(x);
    if (dict == NULL || *dict == NULL)
        return 0;
    PyObject *v = PyDict_GetItemWithError(*dict, s__inference);
    return v == NULL ? (PyErr_Occurred() ? -1 : 0) : PyObject_IsTrue(v);
}

/* torch's refusal of an inference tensor among what a grad node saves (tensor.py's words) */
static int refuse_inference(PyObject *node) {
    PyObject *name = PyObject_GetAttr(get_slot(node, N_op), s_name);
    if (name == NULL)
        return -1;
    PyErr_Format(PyExc_RuntimeError, "holoflow.%S: Inference tensors cannot be saved for backward. Please do "
                 "not use Tensors created in inference mode in computation tracked by autograd. To work "
                 "around this, you can make a clone to get a normal tensor and use it in autograd, or use "
                 "`holoflow.no_grad()` instead of `holoflow.inference_mode()`.", name);
    Py_DECREF(name);
    return -1;
}

/* -- what the grad rule reads (Op.saved_of / Op.outputs_of, GradNode.save) ---------------- */

static PyObject *saved_inputs_of(PyObject *op, PyObject *inputs, PyObject *edges) {
    PyObject *keep = PyObject_GetAttr(op, s_saved_inputs);
    if (keep == NULL)
        return NULL;
    if (keep == Py_None) {
        Py_DECREF(keep);
        Py_INCREF(inputs);
        return inputs;
    }
    if (PyCallable_Check(keep)) {   /* a function of the needs_grad flags: remembered per pattern */
        Py_DECREF(keep);
        keep = NULL;
        Py_ssize_t n = PyTuple_GET_SIZE(edges);
        PyObject *needs = PyTuple_New(n);
        if (needs == NULL)
            return NULL;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *b = PyTuple_GET_ITEM(edges, i) != Py_None ? Py_True : Py_False;
            Py_INCREF(b);
            PyTuple_SET_ITEM(needs, i, b);
        }
        PyObject *known = PyObject_GetAttr(op, s__kept);
        if (known == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
                Py_DECREF(needs);
                return NULL;
            }
            PyErr_Clear();
        } else {
            if (PyDict_Check(known)) {
                keep = PyDict_GetItemWithError(known, needs);
                Py_XINCREF(keep);
            }
            Py_DECREF(known);
        }
        Py_DECREF(needs);
        if (keep == NULL) {
            if (PyErr_Occurred())
                return NULL;
            return PyObject_CallMethodObjArgs(op, s_saved_of, inputs, edges, NULL);   /* fills the cache */
        }
    }
    Py_ssize_t n = PyTuple_GET_SIZE(inputs);
    PyObject *res = PyTuple_New(n);
    if (res == NULL) {
        Py_DECREF(keep);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *idx = PyLong_FromSsize_t(i);
        int in = idx ? PySequence_Contains(keep, idx) : -1;
        Py_XDECREF(idx);
        if (in < 0) {
            Py_DECREF(keep);
            Py_DECREF(res);
            return NULL;
        }
        PyObject *x = in ? PyTuple_GET_ITEM(inputs, i) : Py_None;
        Py_INCREF(x);
        PyTuple_SET_ITEM(res, i, x);
    }
    Py_DECREF(keep);
    return res;
}

/* (d, d._version) appended for each saved storage */
static int add_versions(PyObject *versions, PyObject *datas) {
    Py_ssize_t n = PyTuple_GET_SIZE(datas);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *d = PyTuple_GET_ITEM(datas, i);
        if (d == Py_None)
            continue;
        PyObject *v = PyObject_GetAttr(d, s__version);
        if (v == NULL)
            return -1;
        PyObject *pair = PyTuple_Pack(2, d, v);
        Py_DECREF(v);
        if (pair == NULL || PyList_Append(versions, pair) < 0) {
            Py_XDECREF(pair);
            return -1;
        }
        Py_DECREF(pair);
    }
    return 0;
}

/* GradNode.save without saved-tensor hooks: the rule's inputs (holoflow tensors or constants)
 * and outputs (storages), with the versions of their storages */
static int save(PyObject *node, PyObject *inputs, PyObject *outs) {
    PyObject *versions = PyList_New(0);
    if (versions == NULL)
        return -1;
    if (inputs != NULL) {
        set_slot(node, N_saved, inputs);
        Py_ssize_t n = PyTuple_GET_SIZE(inputs);
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *x = PyTuple_GET_ITEM(inputs, i);
            if (x == Py_None || !PyObject_TypeCheck(x, Tensor_T))
                continue;   /* (the reference asks getattr(x, "_data", None): constants have none) */
            if (inference_made) {
                int inf = is_inference(x);
                if (inf != 0) {
                    Py_DECREF(versions);
                    return inf < 0 ? -1 : refuse_inference(node);
                }
            }
            PyObject *d = get_slot(x, T_data);
            if (d == Py_None)
                continue;
            PyObject *one = PyTuple_Pack(1, d);
            if (one == NULL || add_versions(versions, one) < 0) {
                Py_XDECREF(one);
                Py_DECREF(versions);
                return -1;
            }
            Py_DECREF(one);
        }
    } else {
        PyObject *empty = PyTuple_New(0);
        if (empty == NULL) {
            Py_DECREF(versions);
            return -1;
        }
        set_slot(node, N_saved, empty);
        Py_DECREF(empty);
    }
    if (outs != NULL) {
        set_slot(node, N_outs, outs);
        if (add_versions(versions, outs) < 0) {
            Py_DECREF(versions);
            return -1;
        }
    }
    set_slot(node, N_versions, PyList_GET_SIZE(versions) ? versions : Py_None);
    Py_DECREF(versions);
    return 0;
}

/* dispatch._record for inputs with no views and no logical shapes */
static PyObject *record(PyObject *op, PyObject *inputs, PyObject *attrs, PyObject *outs) {
    Py_ssize_t n = PyTuple_GET_SIZE(inputs);
    PyObject *edges = PyTuple_New(n), *shapes = PyTuple_New(n), *dtypes = PyTuple_New(n);
    PyObject *node = NULL, *saves = NULL, *saved_in = NULL, *saved_out = NULL;
    if (edges == NULL || shapes == NULL || dtypes == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PyTuple_GET_ITEM(inputs, i);
        PyObject *e = Py_None, *s = Py_None, *dt = Py_None;
        int own_e = 0;
        if (PyObject_TypeCheck(x, Tensor_T)) {
            PyObject *d = get_slot(x, T_data);
            s = PyObject_GetAttr(d, s_shape);
            dt = s ? PyObject_GetAttr(d, s_dtype) : NULL;
            if (dt == NULL) {
                Py_XDECREF(s);
                goto fail;
            }
            if (get_slot(x, T_rg) == Py_True) {
                PyObject *fn = get_slot(x, T_grad_fn);
                if (fn != Py_None) {
                    e = PyTuple_Pack(2, fn, get_slot(x, T_out_idx));
                    if (e == NULL) {
                        Py_DECREF(s);
                        Py_DECREF(dt);
                        goto fail;
                    }
                    own_e = 1;
                } else {
                    e = x;
                }
            }
            PyTuple_SET_ITEM(shapes, i, s);
            PyTuple_SET_ITEM(dtypes, i, dt);
        } else {
            Py_INCREF(Py_None);
            PyTuple_SET_ITEM(shapes, i, Py_None);
            Py_INCREF(Py_None);
            PyTuple_SET_ITEM(dtypes, i, Py_None);
        }
        if (!own_e)
            Py_INCREF(e);
        PyTuple_SET_ITEM(edges, i, e);
    }
    {
        PyObject *seq = Py_TYPE(seq_counter)->tp_iternext(seq_counter);
        if (seq == NULL)
            goto fail;
        const Py_ssize_t offs[] = {N_op, N_edges, N_attrs, N_shapes, N_dtypes, N_outs, N_versions, N_out_metas,
                                   N_hooks, N_retains, N_seq};
        PyObject *const vals[] = {op, edges, attrs, shapes, dtypes, Py_None, Py_None, Py_None, Py_None, Py_None,
                                  seq};
        node = alloc_with(Node_T, offs, vals, 11);
        Py_DECREF(seq);
        if (node == NULL)
            goto fail;
    }
    saves = PyObject_GetAttr(op, s_saves);
    if (saves == NULL)
        goto fail;
    if (!PyTuple_Check(saves) || PyTuple_GET_SIZE(saves) != 2) {
        PyErr_SetString(PyExc_TypeError, "holoflow._fast: Op._saves must be a pair");
        goto fail;
    }
    int saves_in = PyObject_IsTrue(PyTuple_GET_ITEM(saves, 0));
    int saves_out = PyObject_IsTrue(PyTuple_GET_ITEM(saves, 1));
    if (saves_in < 0 || saves_out < 0)
        goto fail;
    if (saves_in || saves_out) {
        if (saves_in && (saved_in = saved_inputs_of(op, inputs, edges)) == NULL)
            goto fail;
        if (saves_out) {   /* (Op.outputs_of) */
            PyObject *keep = PyObject_GetAttr(op, s_saved_outputs);
            if (keep == NULL)
                goto fail;
            if (keep == Py_None) {
                saved_out = outs;
                Py_INCREF(saved_out);
            } else {
                Py_ssize_t m = PyTuple_GET_SIZE(outs);
                saved_out = PyTuple_New(m);
                for (Py_ssize_t i = 0; saved_out != NULL && i < m; i++) {
                    PyObject *idx = PyLong_FromSsize_t(i);
                    int in = idx ? PySequence_Contains(keep, idx) : -1;
                    Py_XDECREF(idx);
                    if (in < 0) {
                        Py_CLEAR(saved_out);
                        break;
                    }
                    PyObject *o = in ? PyTuple_GET_ITEM(outs, i) : Py_None;
                    Py_INCREF(o);
                    PyTuple_SET_ITEM(saved_out, i, o);
                }
            }
            Py_DECREF(keep);
            if (saved_out == NULL)
                goto fail;
        }
        PyObject *live = PyList_GET_ITEM(live_hooks, 0);
        int hooked = PyObject_IsTrue(live);
        if (hooked < 0)
            goto fail;
        if (hooked) {   /* saved-tensor hooks may be pushed: GradNode.save packs */
            PyObject *r = PyObject_CallMethodObjArgs(node, s_save, saved_in ? saved_in : Py_None,
                                                     saved_out ? saved_out : Py_None, NULL);
            if (r == NULL)
                goto fail;
            Py_DECREF(r);
        } else if (save(node, saved_in, saved_out) < 0) {
            goto fail;
        }
    } else {
        set_slot(node, N_saved, Py_None);
    }
    int anomaly = attr_true(anomaly_state, s_enabled);
    if (anomaly < 0)
        goto fail;
    if (anomaly) {
        PyObject *r = PyObject_CallOneArg(py_note_forward, node);
        if (r == NULL)
            goto fail;
        Py_DECREF(r);
    }
    Py_DECREF(edges);
    Py_DECREF(shapes);
    Py_DECREF(dtypes);
    Py_DECREF(saves);
    Py_XDECREF(saved_in);
    Py_XDECREF(saved_out);
    return node;
fail:
    Py_XDECREF(edges);
    Py_XDECREF(shapes);
    Py_XDECREF(dtypes);
    Py_XDECREF(node);
    Py_XDECREF(saves);
    Py_XDECREF(saved_in);
    Py_XDECREF(saved_out);
    return NULL;
}

/* a kernel's exception re-raised as op_error makes it (``raise op_error(...) from e``) */
static void reraise_as_op_error(PyObject *op, PyObject *inputs, PyObject *attrs) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL)
        PyException_SetTraceback(value, tb);
    PyObject *err = PyObject_CallFunctionObjArgs(py_op_error, op, inputs, attrs, value, NULL);
    if (err == NULL) {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return;
    }
    Py_INCREF(value);
    PyException_SetCause(err, value);   /* (steals; also sets __suppress_context__) */
    if (err != value) {
        Py_INCREF(value);
        PyException_SetContext(err, value);
    }
    PyErr_SetObject((PyObject *)Py_TYPE(err), err);
    Py_DECREF(err);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
}

#define MAX_FAST_INPUTS 16

static PyObject *s_device, *s_out_type;

static int mark_view(PyObject *t, PyObject *x, PyObject *op, PyObject *attrs, PyObject *idx,
                     PyObject *out, int grad_on);
static int aliases(PyObject *out, PyObject *d);

/* dispatch.wrap for a kernel's several outputs: each wrapped, and linked to one new node when
 * ``record_it`` (the float ones; the node keeps every output's shape, dtype and device); for a
 * view op (``xvi``: its input's ViewInfo or None, NULL for other ops), those aliasing the input
 * become its views. NULL without an error: not all outputs are tensors (the Python wrap decides) */
static PyObject *wrap_many(PyObject *op, PyObject *inputs, PyObject *attrs, PyObject *out, int record_it,
                           int view, int grad_on) {
    PyObject *outs = PySequence_Tuple(out);
    if (outs == NULL)
        return NULL;
    Py_ssize_t m = PyTuple_GET_SIZE(outs);
    for (Py_ssize_t i = 0; i < m; i++)
        if (Py_TYPE(PyTuple_GET_ITEM(outs, i)) != TorchTensor_T) {
            Py_DECREF(outs);
            return NULL;
        }
    PyObject *node = NULL, *metas = NULL, *wrapped = PyTuple_New(m), *r = NULL;
    if (wrapped == NULL)
        goto done;
    if (record_it) {
        if ((node = record(op, inputs, attrs, outs)) == NULL || (metas = PyTuple_New(m)) == NULL)
            goto done;
    }
    for (Py_ssize_t i = 0; i < m; i++) {
        PyObject *o = PyTuple_GET_ITEM(outs, i);
        PyObject *w = new_tensor(o);
        if (w == NULL)
            goto done;
        PyTuple_SET_ITEM(wrapped, i, w);
        if (mark_inference(w, grad_on) < 0)
            goto done;
        if (!record_it)
            continue;
        int tg = takes_grad(o);
        if (tg < 0)
            goto done;
        if (tg) {
            PyObject *idx = PyLong_FromSsize_t(i);
            if (idx == NULL)
                goto done;
            set_slot(w, T_rg, Py_True);
            set_slot(w, T_grad_fn, node);
            set_slot(w, T_out_idx, idx);
            Py_DECREF(idx);
        }
        PyObject *shape = PyObject_GetAttr(o, s_shape), *dt = PyObject_GetAttr(o, s_dtype),
                 *dev = PyObject_GetAttr(o, s_device);
        PyObject *meta = (shape && dt && dev) ? PyTuple_Pack(3, shape, dt, dev) : NULL;
        Py_XDECREF(shape);
        Py_XDECREF(dt);
        Py_XDECREF(dev);
        if (meta == NULL)
            goto done;
        PyTuple_SET_ITEM(metas, i, meta);
    }
    if (record_it)
        set_slot(node, N_out_metas, metas);
    if (view) {   /* (input 0's storage as it is now, as the Python wrap reads it; held) */
        PyObject *x = PyTuple_GET_ITEM(inputs, 0), *d = get_slot(x, T_data);
        Py_INCREF(d);
        for (Py_ssize_t i = 0; i < m; i++) {
            PyObject *o = PyTuple_GET_ITEM(outs, i);
            int al = aliases(o, d);
            PyObject *idx = al > 0 ? PyLong_FromSsize_t(i) : NULL;
            int bad = al < 0 || (al > 0 && (idx == NULL ||
                      mark_view(PyTuple_GET_ITEM(wrapped, i), x, op, attrs, idx, o, grad_on) < 0));
            Py_XDECREF(idx);
            if (bad) {
                Py_DECREF(d);
                goto done;
            }
        }
        Py_DECREF(d);
    }
    PyObject *out_type = PyObject_GetAttr(op, s_out_type);
    if (out_type == NULL)
        goto done;
    if (out_type == Py_None) {
        r = wrapped;
        Py_INCREF(r);
    } else {
        r = PyObject_Call(out_type, wrapped, NULL);
    }
    Py_DECREF(out_type);
done:
    Py_DECREF(outs);
    Py_XDECREF(node);
    Py_XDECREF(metas);
    Py_XDECREF(wrapped);
    return r;
}

/* ``t``, output ``idx`` (None: the only one) of view op ``op`` on ``x``, marked a view of ``x``'s
 * base (views.make_view, eager: a base's stamp token is None) */
static int make_view(PyObject *t, PyObject *x, PyObject *xvi, PyObject *op, PyObject *attrs,
                     PyObject *idx, PyObject *out, int grad_on) {
    PyObject *link = PyTuple_Pack(3, op, attrs, idx), *chain = NULL, *stamp = NULL, *v = NULL;
    PyObject *at = PyObject_GetAttr(out, s__version);
    int r = -1;
    if (link == NULL || at == NULL)
        goto done;
    if (xvi == Py_None) {
        chain = PyTuple_Pack(1, link);
        stamp = PyTuple_Pack(3, get_slot(x, T_grad_fn), get_slot(x, T_out_idx), Py_None);
    } else {   /* a view of a view: the base's chain goes on */
        PyObject *one = PyTuple_Pack(1, link);
        chain = one ? PySequence_Concat(get_slot(xvi, V_chain), one) : NULL;
        Py_XDECREF(one);
        stamp = get_slot(xvi, V_stamp);
        Py_INCREF(stamp);
    }
    if (chain == NULL || stamp == NULL)
        goto done;
    /* one of several outputs, or taken from one */
    int multi = idx != Py_None || (xvi != Py_None && get_slot(xvi, V_version) != Py_None);
    int nograd = !grad_on || (xvi != Py_None && get_slot(xvi, V_nograd) == Py_True);
    const Py_ssize_t offs[] = {V_base, V_chain, V_stamp, V_nograd, V_version, V_at};
    PyObject *const vals[] = {xvi == Py_None ? x : get_slot(xvi, V_base), chain, stamp,
                              nograd ? Py_True : Py_False, multi ? at : Py_None, at};
    if ((v = alloc_with(ViewInfo_T, offs, vals, 6)) != NULL)
        r = PyObject_SetAttr(t, s__view, v);
done:
    Py_XDECREF(link);
    Py_XDECREF(chain);
    Py_XDECREF(stamp);
    Py_XDECREF(at);
    Py_XDECREF(v);
    return r;
}

/* make_view with ``x``'s ViewInfo as it is now (read after the kernel, as the Python path reads
 * it, and held while used) */
static int mark_view(PyObject *t, PyObject *x, PyObject *op, PyObject *attrs, PyObject *idx,
                     PyObject *out, int grad_on) {
    PyObject *xvi = view_info(x);
    if (xvi == NULL)
        return -1;
    if (xvi != Py_None && Py_TYPE(xvi) != ViewInfo_T) {
        PyErr_SetString(PyExc_TypeError, "holoflow: a tensor's _view must be a ViewInfo");
        return -1;
    }
    Py_INCREF(xvi);
    int r = make_view(t, x, xvi, op, attrs, idx, out, grad_on);
    Py_DECREF(xvi);
    return r;
}

/* whether a view op's result aliases its input's storage (views.aliases), -1 on error */
static int aliases(PyObject *out, PyObject *d) {
    if (out == d)
        return 1;
    PyObject *b = PyObject_GetAttr(out, s__base);
    if (b == NULL)
        return -1;
    int r = 0;
    if (b != Py_None) {
        if (b == d) {
            r = 1;
        } else {
            PyObject *db = PyObject_GetAttr(d, s__base);
            if (db == NULL) {
                Py_DECREF(b);
                return -1;
            }
            r = b == db;
            Py_DECREF(db);
        }
    }
    Py_DECREF(b);
    return r;
}

static PyObject *s_token_source;

/* whether an interpreter of the stack tracks values (interpret.token_of is not None: a view's
 * stamp then holds its base's token, views.make_view); -1 on error. Under one that does not
 * (autocast), views are stamped as in eager */
static int tracking_values(void) {
    PyObject *top = NULL;
    if (PyContextVar_Get(current_var, NULL, &top) < 0)
        return -1;
    if (top == NULL || top == Py_None) {
        Py_XDECREF(top);
        return 0;
    }
    PyObject *src = PyObject_GetAttr(top, s_token_source);
    Py_DECREF(top);
    if (src == NULL)
        return -1;
    Py_DECREF(src);
    return src != Py_None;
}

/* dispatch._eager */
static PyObject *eager_impl(PyObject *op, PyObject *inputs, PyObject *attrs) {
    Py_ssize_t n = PyTuple_GET_SIZE(inputs);
    if (n > MAX_FAST_INPUTS)
        return PyObject_CallFunctionObjArgs(py_eager, op, inputs, attrs, NULL);
    PyObject *datas[MAX_FAST_INPUTS], *vis[MAX_FAST_INPUTS];
    int needs_grad = 0, any_view = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PyTuple_GET_ITEM(inputs, i);
        vis[i] = Py_None;
        if (PyObject_TypeCheck(x, Tensor_T)) {
            if (get_slot(x, T_global) != Py_None)   /* the global interpreter takes over */
                return PyObject_CallFunctionObjArgs(py_eager, op, inputs, attrs, NULL);
            PyObject *vi = view_info(x);
            if (vi == NULL)
                return NULL;
            if (vi != Py_None) {
                if (Py_TYPE(vi) != ViewInfo_T)
                    return PyObject_CallFunctionObjArgs(py_eager, op, inputs, attrs, NULL);
                vis[i] = vi;
                any_view = 1;
            }
            if (get_slot(x, T_rg) == Py_True)
                needs_grad = 1;
            datas[i] = get_slot(x, T_data);
        } else {
            datas[i] = x;
        }
    }
    PyObject *g = PyObject_GetAttr(op, s_grad);
    if (g == NULL)
        return NULL;
    int has_grad = g != Py_None;
    Py_DECREF(g);
    int grad_on = attr_true(grad_state, s_enabled);
    if (grad_on < 0)
        return NULL;
    int record_it = needs_grad && has_grad && grad_on;
    if (any_view) {
        /* views the Python path re-derives or checks first: a stale one that autograd records
         * (refresh), one among several outputs of an op written since (check_multi_output), one
         * whose base requires grad (follows_base); any view under a tracer */
        int traced = tracking_values();
        if (traced < 0)
            return NULL;
        if (traced)
            return PyObject_CallFunctionObjArgs(py_eager, op, inputs, attrs, NULL);
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *vi = vis[i];
            if (vi == Py_None)
                continue;
            int st = stale(vi);
            if (st == 0 && record_it)
                st = written_since(PyTuple_GET_ITEM(inputs, i), vi);
            if (st < 0)
                return NULL;
            if (record_it && st)
                return PyObject_CallFunctionObjArgs(py_eager, op, inputs, attrs, NULL);
            PyObject *made = get_slot(vi, V_version);
            if (record_it && made != Py_None) {   /* one of several outputs: unwritten since */
                PyObject *now = PyObject_GetAttr(get_slot(PyTuple_GET_ITEM(inputs, i), T_data), s__version);
                if (now == NULL)
                    return NULL;
                int same = PyObject_RichCompareBool(now, made, Py_EQ);
                Py_DECREF(now);
                if (same < 0)
                    return NULL;
                if (!same)   /* (check_multi_output decides: it may refuse) */
                    return PyObject_CallFunctionObjArgs(py_eager, op, inputs, attrs, NULL);
            }
            /* (a view whose base requires grad does too, with or without a history: follows_base) */
            if (!needs_grad && grad_on && has_grad && get_slot(get_slot(vi, V_base), T_rg) == Py_True)
                return PyObject_CallFunctionObjArgs(py_eager, op, inputs, attrs, NULL);
        }
    }
    int view = attr_true(op, s_view);
    if (view < 0)
        return NULL;
    if (view && (n == 0 || !PyObject_TypeCheck(PyTuple_GET_ITEM(inputs, 0), Tensor_T)))
        return PyObject_CallFunctionObjArgs(py_eager, op, inputs, attrs, NULL);
    if (view && !any_view) {   /* (a view made under a tracer: make_view stamps its token) */
        int traced = tracking_values();
        if (traced < 0)
            return NULL;
        if (traced)
            return PyObject_CallFunctionObjArgs(py_eager, op, inputs, attrs, NULL);
    }
    PyObject *kernel = PyObject_GetAttr(op, s_kernel);
    if (kernel == NULL)
        return NULL;
    /* input 0's storage, held while the kernel runs: a view op's result is compared with it
     * after, and another thread may replace the tensor's storage meanwhile (the kernel releases
     * the GIL) */
    PyObject *d0 = view ? datas[0] : NULL;
    Py_XINCREF(d0);
    PyObject *out = PyObject_VectorcallDict(kernel, datas, (size_t)n,
                                           PyDict_GET_SIZE(attrs) ? attrs : NULL);
    Py_DECREF(kernel);
    if (out == NULL) {
        Py_XDECREF(d0);
        if (PyErr_ExceptionMatches(PyExc_Exception))
            reraise_as_op_error(op, inputs, attrs);
        return NULL;
    }
    if (Py_TYPE(out) != TorchTensor_T) {
        /* (a tensor subclass is one output: the Python wrap takes it, as any result that is not
         * a sequence of plain tensors) */
        PyObject *r = PyObject_TypeCheck(out, TorchTensor_T) ? NULL :
            wrap_many(op, inputs, attrs, out, record_it, view, grad_on);
        if (r == NULL && !PyErr_Occurred())
            r = PyObject_CallFunctionObjArgs(py_wrap, op, inputs, attrs, out,
                                             record_it ? Py_True : Py_False, NULL);
        Py_XDECREF(d0);
        Py_DECREF(out);
        return r;
    }
    PyObject *t = new_tensor(out);
    if (t == NULL)
        goto fail;
    if (mark_inference(t, grad_on) < 0)
        goto fail_t;
    if (record_it) {
        PyObject *outs = PyTuple_Pack(1, out);
        PyObject *node = outs ? record(op, inputs, attrs, outs) : NULL;
        Py_XDECREF(outs);
        if (node == NULL)
            goto fail_t;
        int tg = takes_grad(out);
        if (tg < 0) {
            Py_DECREF(node);
            goto fail_t;
        }
        if (tg) {
            set_slot(t, T_rg, Py_True);
            set_slot(t, T_grad_fn, node);
        }
        Py_DECREF(node);
    }
    if (view) {
        int al = aliases(out, d0);
        if (al < 0)
            goto fail_t;
        if (al && mark_view(t, PyTuple_GET_ITEM(inputs, 0), op, attrs, Py_None, out, grad_on) < 0)
            goto fail_t;
    }
    Py_XDECREF(d0);
    Py_DECREF(out);
    return t;
fail_t:
    Py_DECREF(t);
fail:
    Py_XDECREF(d0);
    Py_DECREF(out);
    return NULL;
}

static PyObject *fast_eager(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyTuple_Check(args[1]) || !PyDict_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "holoflow._fast.eager(op, inputs: tuple, attrs: dict)");
        return NULL;
    }
    return eager_impl(args[0], args[1], args[2]);
}

/* dispatch.apply(op, *inputs, **attrs): the innermost interpreter binds, or eager runs */
static PyObject *fast_apply(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (n < 1) {
        PyErr_SetString(PyExc_TypeError, "holoflow.apply(op, *inputs, **attrs): no op given");
        return NULL;
    }
    PyObject *op = args[0];
    PyObject *inputs = PyTuple_New(n - 1);
    if (inputs == NULL)
        return NULL;
    for (Py_ssize_t i = 1; i < n; i++) {
        Py_INCREF(args[i]);
        PyTuple_SET_ITEM(inputs, i - 1, args[i]);
    }
    PyObject *attrs = PyDict_New(), *r = NULL, *top = NULL;
    if (attrs == NULL)
        goto done;
    Py_ssize_t nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t i = 0; i < nk; i++)
        if (PyDict_SetItem(attrs, PyTuple_GET_ITEM(kwnames, i), args[n + i]) < 0)
            goto done;
    if (PyContextVar_Get(current_var, NULL, &top) < 0)
        goto done;
    if (top != NULL && top != Py_None)
        r = PyObject_CallMethodObjArgs(top, s_bind, op, inputs, attrs, NULL);
    else
        r = eager_impl(op, inputs, attrs);
done:
    Py_XDECREF(top);
    Py_DECREF(inputs);
    Py_XDECREF(attrs);
    return r;
}

/* -- the backward loop (autograd._drain) --------------------------------------------------- */

/* a gradient buffer for ``child``: [None] * child.n_outputs, stored in ``buffers`` (borrowed) */
static PyObject *buffer_of(PyObject *buffers, PyObject *child) {
    PyObject *buf = PyDict_GetItemWithError(buffers, child);
    if (buf != NULL || PyErr_Occurred())
        return buf;
    PyObject *metas = get_slot(child, N_out_metas);
    Py_ssize_t n = 1;
    if (metas != Py_None && (n = PyObject_Length(metas)) < 0)
        return NULL;
    buf = PyList_New(n);
    if (buf == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_INCREF(Py_None);
        PyList_SET_ITEM(buf, i, Py_None);
    }
    int r = PyDict_SetItem(buffers, child, buf);
    Py_DECREF(buf);
    return r < 0 ? NULL : buf;
}

/* d[k] -= 1, returning what is left (-1 on error) */
static Py_ssize_t count_down(PyObject *d, PyObject *k) {
    PyObject *v = PyDict_GetItemWithError(d, k);
    if (v == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetObject(PyExc_KeyError, k);
        return -1;
    }
    Py_ssize_t left = PyLong_AsSsize_t(v) - 1;
    if (left < 0 && PyErr_Occurred())
        return -1;
    PyObject *nv = PyLong_FromSsize_t(left);
    if (nv == NULL || PyDict_SetItem(d, k, nv) < 0) {
        Py_XDECREF(nv);
        return -1;
    }
    Py_DECREF(nv);
    return left;
}

/* -- the ready queue: torch's (a std::priority_queue of nodes by sequence number) ---------- *
 * A binary max-heap in a list, with autograd._heap_push/_heap_pop's steps (heapq's, which are
 * libstdc++'s push_heap/pop_heap): entries of equal key (ready leaves) come out in torch's order.
 * An entry is a node (key: its creation number) or a ready leaf, a (leaf, gradient) tuple (key:
 * the largest, as torch's AccumulateGrad). */

static inline long long entry_key(PyObject *e) {
    if (PyTuple_CheckExact(e))
        return LLONG_MAX;
    return PyLong_AsLongLong(get_slot(e, N_seq));   /* (an int set at creation) */
}

/* appends ``e`` (borrowed; the heap takes a reference) */
static int heap_push(PyObject *heap, PyObject *e) {
    if (PyList_Append(heap, e) < 0)
        return -1;
    PyObject **items = PySequence_Fast_ITEMS(heap);
    Py_ssize_t pos = PyList_GET_SIZE(heap) - 1;
    long long key = entry_key(e);
    while (pos > 0) {
        Py_ssize_t parent = (pos - 1) >> 1;
        if (!(entry_key(items[parent]) < key))
            break;
        items[pos] = items[parent];
        pos = parent;
    }
    items[pos] = e;
    return 0;
}

/* the entry of the largest key (a new reference); the heap must not be empty */
static PyObject *heap_pop(PyObject *heap) {
    Py_ssize_t n = PyList_GET_SIZE(heap) - 1;
    PyObject *last = PyList_GET_ITEM(heap, n);
    Py_INCREF(last);
    if (PyList_SetSlice(heap, n, n + 1, NULL) < 0) {
        Py_DECREF(last);
        return NULL;
    }
    if (n == 0)
        return last;
    PyObject **items = PySequence_Fast_ITEMS(heap);
    PyObject *top = items[0];   /* (the list's reference, now the caller's; last's goes to the list) */
    long long key = entry_key(last);
    Py_ssize_t pos = 0, child = 1;
    while (child < n) {   /* the hole goes down the larger children to the bottom ... */
        if (child + 1 < n && !(entry_key(items[child + 1]) < entry_key(items[child])))
            child++;
        items[pos] = items[child];
        pos = child;
        child = 2 * pos + 1;
    }
    while (pos > 0) {     /* ... and the last entry comes up from there */
        Py_ssize_t parent = (pos - 1) >> 1;
        if (!(entry_key(items[parent]) < key))
            break;
        items[pos] = items[parent];
        pos = parent;
    }
    items[pos] = last;
    return top;
}

/* a leaf whose last gradient came: queued as torch queues its AccumulateGrad */
static int push_leaf(PyObject *heap, PyObject *leaf, PyObject *g) {
    PyObject *e = PyTuple_Pack(2, leaf, g);
    if (e == NULL)
        return -1;
    int r = heap_push(heap, e);
    Py_DECREF(e);
    return r;
}

/* ``old + g`` where old may be None: a new reference */
static PyObject *summed(PyObject *old, PyObject *g) {
    if (old == NULL || old == Py_None) {
        Py_INCREF(g);
        return g;
    }
    return PyNumber_Add(old, g);
}

/* hands each input gradient to its edge: a node's buffer (a node whose last gradient came is
 * ready), or a leaf (its gradients summed, ready once the last came) */
static int distribute(PyObject *edges, PyObject *in_grads, PyObject *buffers, PyObject *deps,
                      PyObject *ready, PyObject *leaf_deps, PyObject *leaf_sums) {
    Py_ssize_t n = PyTuple_GET_SIZE(edges);
    if (PyTuple_GET_SIZE(in_grads) < n)
        n = PyTuple_GET_SIZE(in_grads);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *e = PyTuple_GET_ITEM(edges, i), *g = PyTuple_GET_ITEM(in_grads, i);
        if (e == Py_None)
            continue;
        if (PyTuple_CheckExact(e)) {
            PyObject *child = PyTuple_GET_ITEM(e, 0);
            Py_ssize_t idx = PyLong_AsSsize_t(PyTuple_GET_ITEM(e, 1));
            if (idx == -1 && PyErr_Occurred())
                return -1;
            PyObject *buf = buffer_of(buffers, child);
            if (buf == NULL)
                return -1;
            if (g != Py_None) {
                if (!PyList_Check(buf) || idx >= PyList_GET_SIZE(buf)) {
                    PyErr_SetString(PyExc_IndexError, "holoflow: a gradient for an output a node does not have");
                    return -1;
                }
                PyObject *sum = summed(PyList_GET_ITEM(buf, idx), g);
                if (sum == NULL || PyList_SetItem(buf, idx, sum) < 0)   /* (steals sum) */
                    return -1;
            }
            Py_ssize_t left = count_down(deps, child);
            if (left < 0)
                return -1;
            if (left == 0 && heap_push(ready, child) < 0)
                return -1;
        } else {
            PyObject *k = PyLong_FromVoidPtr(e);
            if (k == NULL)
                return -1;
            Py_ssize_t left = count_down(leaf_deps, k);
            int waiting = left > 0 ? 1 : (left == 0 ? PyDict_Contains(leaf_sums, k) : -1);
            int r = 0;
            if (waiting < 0) {
                r = -1;
            } else if (waiting) {
                if (g != Py_None) {
                    PyObject *old = PyDict_GetItemWithError(leaf_sums, k);
                    PyObject *sum = (old != NULL || !PyErr_Occurred()) ? summed(old, g) : NULL;
                    r = (sum == NULL || PyDict_SetItem(leaf_sums, k, sum) < 0) ? -1 : 0;
                    Py_XDECREF(sum);
                }
                if (r == 0 && left == 0) {
                    PyObject *all = PyDict_GetItemWithError(leaf_sums, k);
                    if (all != NULL) {
                        Py_INCREF(all);
                        r = PyDict_DelItem(leaf_sums, k);
                        if (r == 0)
                            r = push_leaf(ready, e, all);
                        Py_DECREF(all);
                    } else if (PyErr_Occurred()) {
                        r = -1;
                    }
                }
            } else {
                r = push_leaf(ready, e, g);
            }
            Py_DECREF(k);
            if (r < 0)
                return -1;
        }
    }
    return 0;
}

static PyObject *s_grad_reads;

/* one node whose rule needs nothing but its output gradients: the rule's result, one gradient
 * per edge; Py_NotImplemented (a new reference) where an output with no gradient must be given
 * to the rule as zeros (autograd._call_grad makes them) */
static PyObject *run_plain(PyObject *node, PyObject *gs, PyObject *edges, int retain_graph,
                           PyObject *freed, PyObject *as_grads) {
    Py_ssize_t m = PyList_GET_SIZE(gs), n = PyTuple_GET_SIZE(edges), present = 0;
    for (Py_ssize_t i = 0; i < m; i++)
        present += PyList_GET_ITEM(gs, i) != Py_None;
    if (present == 0) {
        PyObject *none = PyTuple_New(n);
        for (Py_ssize_t i = 0; none != NULL && i < n; i++) {
            Py_INCREF(Py_None);
            PyTuple_SET_ITEM(none, i, Py_None);
        }
        return none;
    }
    PyObject *args[MAX_FAST_INPUTS + 1];
    if (m > MAX_FAST_INPUTS)
        Py_RETURN_NOTIMPLEMENTED;
    if (present < m) {   /* an output without a gradient: None only where the rule does not read it */
        PyObject *reads = PyObject_GetAttr(get_slot(node, N_op), s_grad_reads);
        if (reads == NULL)
            return NULL;
        for (Py_ssize_t i = 0; i < m; i++) {
            if (PyList_GET_ITEM(gs, i) != Py_None)
                continue;
            PyObject *idx = PyLong_FromSsize_t(i);
            int read = reads == Py_None ? 1 : (idx ? PySequence_Contains(reads, idx) : -1);
            Py_XDECREF(idx);
            if (read != 0) {
                Py_DECREF(reads);
                if (read < 0)
                    return NULL;
                Py_RETURN_NOTIMPLEMENTED;
            }
        }
        Py_DECREF(reads);
    }
    args[0] = node;
    for (Py_ssize_t i = 0; i < m; i++)
        args[i + 1] = PyList_GET_ITEM(gs, i);
    PyObject *op = get_slot(node, N_op);
    PyObject *rule = PyObject_GetAttr(op, s_grad);
    if (rule == NULL)
        return NULL;
    PyObject *in_grads = PyObject_Vectorcall(rule, args, (size_t)(m + 1), NULL);
    Py_DECREF(rule);
    if (in_grads == NULL)
        return NULL;
    if (!PyTuple_CheckExact(in_grads) || PyTuple_GET_SIZE(in_grads) != n) {
        /* (a lone gradient is wrapped; a count that is wrong raises) */
        PyObject *r = PyObject_CallFunctionObjArgs(as_grads, node, in_grads, NULL);
        Py_DECREF(in_grads);
        if (r == NULL)
            return NULL;
        in_grads = r;
    }
    if (!retain_graph) {   /* what the rule read is freed, as torch frees a node's saved tensors */
        PyObject *save = PyObject_GetAttr(op, s_save);
        int saves = save ? PyObject_IsTrue(save) : -1;
        Py_XDECREF(save);
        if (saves < 0) {
            Py_DECREF(in_grads);
            return NULL;
        }
        if (saves) {
            set_slot(node, N_saved, freed);
            set_slot(node, N_outs, Py_None);
            set_slot(node, N_versions, Py_None);
        }
    }
    return in_grads;
}

/* drain(ready, buffers, deps, leaf_deps, leaf_sums, to_leaf, retain_graph, freed, as_grads,
 *       run_node) */
static PyObject *fast_drain(PyObject *self, PyObject *args) {
    PyObject *ready, *buffers, *deps, *leaf_deps, *leaf_sums, *to_leaf, *freed, *as_grads, *run_node;
    int retain_graph;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!OpOOO", &PyList_Type, &ready, &PyDict_Type, &buffers,
                          &PyDict_Type, &deps, &PyDict_Type, &leaf_deps, &PyDict_Type, &leaf_sums,
                          &to_leaf, &retain_graph, &freed, &as_grads, &run_node))
        return NULL;
    if (Node_T == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "holoflow._fast.drain: init() was not called");
        return NULL;
    }
    while (PyList_GET_SIZE(ready)) {
        PyObject *node = heap_pop(ready);
        if (node == NULL)
            return NULL;
        if (PyTuple_CheckExact(node)) {   /* a leaf: its summed gradient (or None) handed over */
            PyObject *done = PyObject_CallFunctionObjArgs(to_leaf, PyTuple_GET_ITEM(node, 0),
                                                          PyTuple_GET_ITEM(node, 1), NULL);
            Py_DECREF(node);
            if (done == NULL)
                return NULL;
            Py_DECREF(done);
            continue;
        }
        PyObject *gs = PyDict_GetItemWithError(buffers, node);
        if (gs == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetObject(PyExc_KeyError, node);
            Py_DECREF(node);
            return NULL;
        }
        Py_INCREF(gs);
        PyObject *edges = NULL, *in_grads = NULL;
        if (PyDict_DelItem(buffers, node) < 0)
            goto fail;
        edges = get_slot(node, N_edges);
        Py_INCREF(edges);
        if (Py_TYPE(node) == Node_T && PyList_CheckExact(gs) && PyTuple_CheckExact(edges) &&
            !PyObject_IsTrue(get_slot(node, N_hooks)) && !PyObject_IsTrue(get_slot(node, N_retains)))
            in_grads = run_plain(node, gs, edges, retain_graph, freed, as_grads);
        else   /* hooks, retained gradients, packed saved tensors */
            in_grads = PyObject_CallFunctionObjArgs(run_node, node, gs, NULL);
        if (in_grads == Py_NotImplemented) {   /* (zeros for outputs without a gradient) */
            Py_DECREF(in_grads);
            in_grads = PyObject_CallFunctionObjArgs(run_node, node, gs, NULL);
        }
        Py_CLEAR(gs);
        if (in_grads == NULL)
            goto fail;
        if (!PyTuple_Check(in_grads)) {   /* (a node post-hook's list, say) */
            Py_SETREF(in_grads, PySequence_Tuple(in_grads));
            if (in_grads == NULL)
                goto fail;
        }
        if (!PyTuple_Check(edges)) {
            Py_SETREF(edges, PySequence_Tuple(edges));
            if (edges == NULL)
                goto fail;
        }
        if (distribute(edges, in_grads, buffers, deps, ready, leaf_deps, leaf_sums) < 0)
            goto fail;
        Py_DECREF(in_grads);
        Py_DECREF(edges);
        Py_DECREF(node);
        continue;
    fail:
        Py_XDECREF(gs);
        Py_XDECREF(in_grads);
        Py_XDECREF(edges);
        Py_DECREF(node);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* -- binary_method: ``Tensor.__<op>__`` as one C call ------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *op;
    PyObject *fixed;   /* attrs every call passes (a dict) */
    PyObject *name;
    vectorcallfunc vectorcall;
} BinaryMethod;

static PyObject *binary_call(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    BinaryMethod *m = (BinaryMethod *)self;
    if (PyVectorcall_NARGS(nargsf) != 2 || kwnames != NULL) {
        PyErr_Format(PyExc_TypeError, "%U(self, other) takes exactly two arguments", m->name);
        return NULL;
    }
    PyObject *inputs = PyTuple_Pack(2, args[0], args[1]);
    if (inputs == NULL)
        return NULL;
    PyObject *attrs = PyDict_Copy(m->fixed), *top = NULL, *r = NULL;
    if (attrs == NULL || PyContextVar_Get(current_var, NULL, &top) < 0)
        goto done;
    if (top != NULL && top != Py_None)
        r = PyObject_CallMethodObjArgs(top, s_bind, m->op, inputs, attrs, NULL);
    else
        r = eager_impl(m->op, inputs, attrs);
done:
    Py_XDECREF(top);
    Py_DECREF(inputs);
    Py_XDECREF(attrs);
    return r;
}

static PyObject *binary_get(PyObject *self, PyObject *obj, PyObject *type) {
    if (obj == NULL || obj == Py_None) {
        Py_INCREF(self);
        return self;
    }
    return PyMethod_New(self, obj);
}

static void binary_dealloc(PyObject *self) {
    BinaryMethod *m = (BinaryMethod *)self;
    PyObject_GC_UnTrack(self);
    Py_XDECREF(m->op);
    Py_XDECREF(m->fixed);
    Py_XDECREF(m->name);
    PyObject_GC_Del(self);
}

static int binary_traverse(PyObject *self, visitproc visit, void *arg) {
    BinaryMethod *m = (BinaryMethod *)self;
    Py_VISIT(m->op);
    Py_VISIT(m->fixed);
    return 0;
}

static PyObject *binary_name(PyObject *self, void *closure) {
    PyObject *name = ((BinaryMethod *)self)->name;
    Py_INCREF(name);
    return name;
}

static PyGetSetDef binary_getset[] = {
    {"__name__", binary_name, NULL, NULL, NULL},
    {"__qualname__", binary_name, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject BinaryMethod_T = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "holoflow.core._fast.BinaryMethod",
    .tp_basicsize = sizeof(BinaryMethod),
    .tp_dealloc = binary_dealloc,
    .tp_vectorcall_offset = offsetof(BinaryMethod, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "Tensor.__<op>__(self, other): apply(op, self, other, **fixed) in one call.",
    .tp_traverse = binary_traverse,
    .tp_descr_get = binary_get,
    .tp_getset = binary_getset,
};

/* binary_method(op, name, fixed) */
static PyObject *fast_binary_method(PyObject *self, PyObject *args) {
    PyObject *op, *name, *fixed;
    if (!PyArg_ParseTuple(args, "OUO!", &op, &name, &PyDict_Type, &fixed))
        return NULL;
    BinaryMethod *m = PyObject_GC_New(BinaryMethod, &BinaryMethod_T);
    if (m == NULL)
        return NULL;
    Py_INCREF(op);
    Py_INCREF(name);
    m->op = op;
    m->name = name;
    m->fixed = PyDict_Copy(fixed);
    m->vectorcall = binary_call;
    if (m->fixed == NULL) {
        Py_DECREF(m);
        return NULL;
    }
    PyObject_GC_Track((PyObject *)m);
    return (PyObject *)m;
}

static PyObject *fast_init(PyObject *self, PyObject *args) {
    PyObject *tensor_t, *node_t, *torch_t, *view_t;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOOO", &tensor_t, &node_t, &torch_t, &view_t, &py_eager,
                          &py_wrap, &py_op_error, &current_var, &grad_state, &anomaly_state,
                          &live_hooks, &py_note_forward, &seq_counter))
        return NULL;
    if (!PyType_Check(tensor_t) || !PyType_Check(node_t) || !PyType_Check(torch_t) ||
        !PyType_Check(view_t) || !PyIter_Check(seq_counter) ||
        !PyList_Check(live_hooks) || PyList_GET_SIZE(live_hooks) != 1) {
        PyErr_SetString(PyExc_TypeError, "holoflow._fast.init: unexpected arguments");
        return NULL;
    }
    Tensor_T = (PyTypeObject *)tensor_t;
    Node_T = (PyTypeObject *)node_t;
    TorchTensor_T = (PyTypeObject *)torch_t;
    ViewInfo_T = (PyTypeObject *)view_t;
    PyObject *held[] = {tensor_t, node_t, torch_t, view_t, py_eager, py_wrap, py_op_error,
                        current_var, grad_state, anomaly_state, live_hooks, py_note_forward, seq_counter};
    for (size_t i = 0; i < sizeof(held) / sizeof(held[0]); i++)
        Py_INCREF(held[i]);
    if (slot_offset(Tensor_T, "_data", &T_data) || slot_offset(Tensor_T, "_rg", &T_rg) ||
        slot_offset(Tensor_T, "_grad", &T_grad) || slot_offset(Tensor_T, "_grad_fn", &T_grad_fn) ||
        slot_offset(Tensor_T, "_out_idx", &T_out_idx) || slot_offset(Tensor_T, "_hooks", &T_hooks) ||
        slot_offset(Tensor_T, "_global", &T_global) || slot_offset(Node_T, "op", &N_op) ||
        slot_offset(Node_T, "edges", &N_edges) || slot_offset(Node_T, "attrs", &N_attrs) ||
        slot_offset(Node_T, "shapes", &N_shapes) || slot_offset(Node_T, "dtypes", &N_dtypes) ||
        slot_offset(Node_T, "_saved", &N_saved) || slot_offset(Node_T, "_versions", &N_versions) ||
        slot_offset(Node_T, "_outs", &N_outs) || slot_offset(Node_T, "out_metas", &N_out_metas) ||
        slot_offset(Node_T, "hooks", &N_hooks) || slot_offset(Node_T, "retains", &N_retains) ||
        slot_offset(Node_T, "seq", &N_seq) ||
        slot_offset(ViewInfo_T, "base", &V_base) || slot_offset(ViewInfo_T, "chain", &V_chain) ||
        slot_offset(ViewInfo_T, "stamp", &V_stamp) || slot_offset(ViewInfo_T, "nograd", &V_nograd) ||
        slot_offset(ViewInfo_T, "version", &V_version) || slot_offset(ViewInfo_T, "at", &V_at))
        return NULL;
    float_dtypes = PyDict_New();
    zero = PyLong_FromLong(0);
    if (float_dtypes == NULL || zero == NULL)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *fast_note_inference(PyObject *self, PyObject *unused) {
    inference_made = 1;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"note_inference", fast_note_inference, METH_NOARGS,
     "Inference mode was entered: ops mark what they make there, saves check (grad_mode.py)."},
    {"init", fast_init, METH_VARARGS, "Hands the classes and Python helpers over (dispatch.py)."},
    {"eager", (PyCFunction)(void (*)(void))fast_eager, METH_FASTCALL, "dispatch._eager in C."},
    {"drain", fast_drain, METH_VARARGS, "autograd._drain's loop in C (no hooks, captures or anomaly mode)."},
    {"binary_method", fast_binary_method, METH_VARARGS,
     "binary_method(op, name, fixed: dict): Tensor.__<op>__ in C."},
    {"apply", (PyCFunction)(void (*)(void))fast_apply, METH_FASTCALL | METH_KEYWORDS,
     "apply(op, *inputs, **attrs): runs op with the active interpreters."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fast", NULL, -1, methods};

PyMODINIT_FUNC PyInit__fast(void) {
#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL
    INTERN(s_kernel, "kernel");
    INTERN(s_grad, "grad");
    INTERN(s_view, "view");
    INTERN(s_saves, "_saves");
    INTERN(s_saved_inputs, "saved_inputs");
    INTERN(s_saved_outputs, "saved_outputs");
    INTERN(s_shape, "shape");
    INTERN(s_dtype, "dtype");
    INTERN(s__version, "_version");
    INTERN(s__view, "_view");
    INTERN(s_enabled, "enabled");
    INTERN(s_inference, "inference");
    INTERN(s__inference, "_inference");
    INTERN(s_name, "name");
    INTERN(s_bind, "bind");
    INTERN(s_saved_of, "saved_of");
    INTERN(s_save, "save");
    INTERN(s__kept, "_kept");
    INTERN(s_is_floating_point, "is_floating_point");
    INTERN(s_is_complex, "is_complex");
    INTERN(s__base, "_base");
    INTERN(s_device, "device");
    INTERN(s_grad_reads, "grad_reads");
    INTERN(s_token_source, "token_source");
    INTERN(s_out_type, "out_type");
#undef INTERN
    if (PyType_Ready(&BinaryMethod_T) < 0)
        return NULL;
    return PyModule_Create(&module);
}
