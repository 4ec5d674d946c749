/* The compiled hot path of section timing (see dist_logging/stragglers/_core.py, which falls back to the same
 * classes written in Python when this module is not built).
 *
 * Why C: a section is entered and left a few times per training step, right after the step's device wait,
 * when the CPU caches are cold. Interpreting a Python __enter__/__exit__ then costs several microseconds per
 * step (docs/stragglers.md, "Cost"); these methods cost about what the with-statement itself costs.
 *
 * Only the common case runs here: the outermost section on the wall clock. It pushes and pops the same frame
 * tuples the Python timer uses, (section, start, contribution, inside_wait, None), on the timer's own list, so
 * a nested section, a CUDA section or an out-of-order exit goes to SectionTimer.enter / SectionTimer.exit
 * (Python) and sees exactly the frames it would have pushed itself. Both paths read one clock: clock() below,
 * which SectionTimer uses by default when this module is built.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <time.h>

#define ADD 1 /* a frame's contribution to busy time: +1 for top-level work (see timer.py) */

static PyObject *enter_name; /* "enter" */
static PyObject *exit_name;  /* "exit" */

static inline double monotonic_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static PyObject *clock_now(PyObject *module, PyObject *unused)
{
    return PyFloat_FromDouble(monotonic_seconds());
}

/* ------------------------------------------------------------------ TimerCore: the totals a section adds to */

typedef struct {
    PyObject_HEAD
    double busy;
    double wait;
    char work_marked;
} TimerCore;

static PyMemberDef timer_members[] = {
    {"_busy", T_DOUBLE, offsetof(TimerCore, busy), 0, "busy seconds in the current window"},
    {"_wait", T_DOUBLE, offsetof(TimerCore, wait), 0, "top-level wait seconds in the current window"},
    {"work_marked", T_BOOL, offsetof(TimerCore, work_marked), 0,
     "whether a work section closed in the current window"},
    {NULL},
};

static PyTypeObject TimerCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dist_logging.stragglers._csections.TimerCore",
    .tp_doc = "Base of SectionTimer: the window's busy and wait seconds, kept where the compiled sections add them.",
    .tp_basicsize = sizeof(TimerCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_new = PyType_GenericNew,
    .tp_members = timer_members,
};

/* ------------------------------------------------------------------ SectionCore */

typedef struct {
    PyObject_HEAD
    PyObject *timer; /* the SectionTimer (a TimerCore) */
    PyObject *stack; /* the timer's list of open frames */
    PyObject *clock; /* the timer's clock (used by the Python core; kept here so both cores have one layout) */
    PyObject *top;   /* the contribution of an outermost frame: 1 for work, 0 for a wait */
    double seconds;  /* on the wall clock, in the current window */
    char entered;    /* closed at least once in the current window */
    char wall;       /* this fast path may run: wall clock for sure, and the timer reads clock() */
    char wait;       /* a wait section */
} SectionCore;

static PyMemberDef section_members[] = {
    {"_timer", T_OBJECT_EX, offsetof(SectionCore, timer), 0, NULL},
    {"_stack", T_OBJECT_EX, offsetof(SectionCore, stack), 0, NULL},
    {"_clock", T_OBJECT_EX, offsetof(SectionCore, clock), 0, NULL},
    {"_top", T_OBJECT_EX, offsetof(SectionCore, top), 0, NULL},
    {"_seconds", T_DOUBLE, offsetof(SectionCore, seconds), 0, NULL},
    {"_entered", T_BOOL, offsetof(SectionCore, entered), 0, NULL},
    {"_wall", T_BOOL, offsetof(SectionCore, wall), 0, NULL},
    {"wait", T_BOOL, offsetof(SectionCore, wait), 0,
     "True for a block where this rank waits for others: counted as waiting, not as busy time."},
    {NULL},
};

static int section_traverse(SectionCore *self, visitproc visit, void *arg)
{
    Py_VISIT(self->timer);
    Py_VISIT(self->stack);
    Py_VISIT(self->clock);
    Py_VISIT(self->top);
    return 0;
}

static int section_clear(SectionCore *self)
{
    Py_CLEAR(self->timer);
    Py_CLEAR(self->stack);
    Py_CLEAR(self->clock);
    Py_CLEAR(self->top);
    return 0;
}

/* A static type: the heap subclasses (Section) visit and release their type themselves (subtype_dealloc). */
static void section_dealloc(SectionCore *self)
{
    PyObject_GC_UnTrack(self);
    section_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static inline int fast_path_ready(SectionCore *self)
{
    return self->wall && self->stack != NULL && PyList_CheckExact(self->stack) && self->timer != NULL &&
           PyObject_TypeCheck(self->timer, &TimerCoreType) && self->top != NULL;
}

static PyObject *section_enter(SectionCore *self, PyObject *unused)
{
    if (fast_path_ready(self) && PyList_GET_SIZE(self->stack) == 0) {
        PyObject *start = PyFloat_FromDouble(monotonic_seconds());
        if (start == NULL)
            return NULL;
        PyObject *frame = PyTuple_Pack(5, (PyObject *)self, start, self->top, self->wait ? Py_True : Py_False,
                                       Py_None);
        Py_DECREF(start);
        if (frame == NULL)
            return NULL;
        int failed = PyList_Append(self->stack, frame);
        Py_DECREF(frame);
        if (failed)
            return NULL;
    } else {
        if (self->timer == NULL) {
            PyErr_SetString(PyExc_RuntimeError, "section is not attached to a timer");
            return NULL;
        }
        PyObject *done = PyObject_CallMethodOneArg(self->timer, enter_name, (PyObject *)self);
        if (done == NULL)
            return NULL;
        Py_DECREF(done);
    }
    Py_INCREF(self);
    return (PyObject *)self;
}

static PyObject *section_exit(SectionCore *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (fast_path_ready(self) && PyList_GET_SIZE(self->stack) == 1) {
        PyObject *frame = PyList_GET_ITEM(self->stack, 0);
        if (PyTuple_CheckExact(frame) && PyTuple_GET_SIZE(frame) == 5 &&
            PyTuple_GET_ITEM(frame, 0) == (PyObject *)self && PyTuple_GET_ITEM(frame, 4) == Py_None &&
            PyFloat_CheckExact(PyTuple_GET_ITEM(frame, 1))) {
            double seconds = monotonic_seconds() - PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(frame, 1));
            long contribution = PyLong_AsLong(PyTuple_GET_ITEM(frame, 2));
            if (contribution == -1 && PyErr_Occurred())
                return NULL;
            int top_wait = PyTuple_GET_ITEM(frame, 3) == Py_True;
            if (PyList_SetSlice(self->stack, 0, 1, NULL) < 0)
                return NULL;
            TimerCore *timer = (TimerCore *)self->timer;
            self->seconds += seconds;
            self->entered = 1;
            if (contribution == ADD) {
                timer->busy += seconds;
                timer->work_marked = 1;
            } else if (top_wait) {
                timer->wait += seconds;
            }
            Py_RETURN_NONE;
        }
    }
    if (self->timer == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "section is not attached to a timer");
        return NULL;
    }
    PyObject *done = PyObject_CallMethodOneArg(self->timer, exit_name, (PyObject *)self);
    if (done == NULL)
        return NULL;
    Py_DECREF(done);
    Py_RETURN_NONE; /* never swallows the block's exception */
}

static PyMethodDef section_methods[] = {
    {"__enter__", (PyCFunction)section_enter, METH_NOARGS, "Open the section (a frame on the timer's stack)."},
    {"__exit__", (PyCFunction)(void (*)(void))section_exit, METH_FASTCALL,
     "Close the innermost frame, which must be this section's; never swallows the block's exception.\n\n"
     "Raises:\n    RuntimeError: this section is not the innermost open section (sections must nest)."},
    {NULL},
};

static PyTypeObject SectionCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dist_logging.stragglers._csections.SectionCore",
    .tp_doc = "Base of Section: its with-statement, compiled for the outermost section on the wall clock.",
    .tp_basicsize = sizeof(SectionCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_traverse = (traverseproc)section_traverse,
    .tp_clear = (inquiry)section_clear,
    .tp_dealloc = (destructor)section_dealloc,
    .tp_members = section_members,
    .tp_methods = section_methods,
};

/* ------------------------------------------------------------------ NullSectionCore */

static PyObject *null_enter(PyObject *self, PyObject *unused)
{
    Py_INCREF(self);
    return self;
}

static PyObject *null_exit(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_RETURN_NONE;
}

static PyMethodDef null_methods[] = {
    {"__enter__", (PyCFunction)null_enter, METH_NOARGS, "Nothing to open."},
    {"__exit__", (PyCFunction)(void (*)(void))null_exit, METH_FASTCALL, "Nothing to close."},
    {NULL},
};

static PyTypeObject NullSectionCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dist_logging.stragglers._csections.NullSectionCore",
    .tp_doc = "Base of NullSection: a with-statement that does nothing, compiled.",
    .tp_basicsize = sizeof(PyObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_new = PyType_GenericNew,
    .tp_methods = null_methods,
};

/* ------------------------------------------------------------------ module */

static PyMethodDef module_methods[] = {
    {"clock", clock_now, METH_NOARGS,
     "Seconds on the monotonic clock (CLOCK_MONOTONIC, what time.perf_counter reads on Linux)."},
    {NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_csections",
    .m_doc = "The compiled hot path of section timing (see _core.py).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__csections(void)
{
    enter_name = PyUnicode_InternFromString("enter");
    exit_name = PyUnicode_InternFromString("exit");
    if (enter_name == NULL || exit_name == NULL)
        return NULL;
    if (PyType_Ready(&TimerCoreType) < 0 || PyType_Ready(&SectionCoreType) < 0 ||
        PyType_Ready(&NullSectionCoreType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    PyTypeObject *types[] = {&TimerCoreType, &SectionCoreType, &NullSectionCoreType};
    const char *names[] = {"TimerCore", "SectionCore", "NullSectionCore"};
    for (int i = 0; i < 3; i++) {
        Py_INCREF(types[i]);
        if (PyModule_AddObject(m, names[i], (PyObject *)types[i]) < 0) {
            Py_DECREF(types[i]);
            Py_DECREF(m);
            return NULL;
        }
    }
    return m;
}
