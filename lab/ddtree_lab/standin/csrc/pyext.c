/*
 * Lab stand-in for one of sglang-kernel's compiled extension modules
 * (sgl_kernel/sm100/common_ops.abi3.so, flash_ops.abi3.so, ...): a stable-ABI
 * Python module whose DT_NEEDED list is the real one, so importing it fails with
 * the loader's own message when a CUDA 13 library is missing.
 *
 *   MODULE_NAME  the module's name (common_ops, flash_ops, ...)
 *   PYINIT       PyInit_<MODULE_NAME>
 * It calls torch_standin_label() from the stand-in libtorch.so, so it binds to
 * torch the way the real kernels do (an absent symbol is an "undefined symbol").
 */
#define Py_LIMITED_API 0x030A0000
#include <Python.h>

extern const char *torch_standin_label(void);

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    MODULE_NAME,
    "ddtree-deploy lab stand-in of an sglang-kernel 0.4.2 extension (no kernels).",
    -1,
    NULL,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PYINIT(void)
{
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    if (PyModule_AddStringConstant(module, "STANDIN", "sglang-kernel 0.4.2 lab stand-in") < 0 ||
        PyModule_AddStringConstant(module, "torch_label", torch_standin_label()) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
