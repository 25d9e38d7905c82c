// The Python extension module convnets._convnets: the library's loader, inference and export as Python types and functions, its errors as Python exceptions. The package's .py files add only names, defaults and docs.
#include "codec/image.h"
#include "core/compat.h"
#include "core/error.h"
#include "core/json.h"
#include "core/options.h"
#include "data/dataset.h"
#include "data/pipeline.h"
#include "deploy/export.h"
#include "deploy/inference.h"
#include "distributed/env.h"
#include "models/registry.h"

#include <c10/util/Exception.h>
#include <torch/csrc/utils/pybind.h>  // at::Tensor <-> torch.Tensor without a copy

#include <pybind11/stl.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace py = pybind11;

namespace convnets::python {
namespace {

// Created at import; the translator raises them.
PyObject* g_bad_image = nullptr;
PyObject* g_image_too_large = nullptr;
PyObject* g_bad_image_warning = nullptr;

std::string message(const Error& e) { return e.hint().empty() ? e.what() : std::string(e.what()) + "\nhint: " + e.hint(); }

// As the CLI prints them, but raised as the Python exception their kind is.
void translate(std::exception_ptr p) {
  try {
    std::rethrow_exception(p);
  } catch (const codec::DecodeError& e) {
    PyErr_SetString(e.too_large() ? g_image_too_large : g_bad_image, message(e).c_str());
  } catch (const Error& e) {
    PyObject* type = e.kind() == ErrorKind::NotFound ? PyExc_FileNotFoundError
                     : e.kind() == ErrorKind::Io     ? PyExc_OSError
                                                     : PyExc_ValueError;
    PyErr_SetString(type, message(e).c_str());
  } catch (const c10::Error& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
  }
}

// nlohmann JSON (the CLI's --json documents) as Python objects.
py::object to_python(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return py::none();
    case nlohmann::ordered_json::value_t::boolean: return py::bool_(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return py::int_(j.get<std::int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: return py::int_(j.get<std::uint64_t>());
    case nlohmann::ordered_json::value_t::number_float: return py::float_(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return py::str(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      py::list out;
      for (const auto& v : j) out.append(to_python(v));
      return std::move(out);
    }
    case nlohmann::ordered_json::value_t::object: {
      py::dict out;
      for (const auto& [k, v] : j.items()) out[py::str(k)] = to_python(v);
      return std::move(out);
    }
    default: return py::none();
  }
}

at::ScalarType parse_dtype(const std::string& name) {
  if (name == "float32" || name == "float") return at::kFloat;
  if (name == "float16" || name == "half") return at::kHalf;
  if (name == "bfloat16") return at::kBFloat16;
  throw Error("dtype " + name + ": expected torch.float32, torch.float16 or torch.bfloat16");
}

at::MemoryFormat parse_memory_format(const std::string& name) {
  if (name == "channels_last") return at::MemoryFormat::ChannelsLast;
  if (name == "contiguous_format" || name == "contiguous") return at::MemoryFormat::Contiguous;
  throw Error("memory_format " + name + ": expected torch.channels_last or torch.contiguous_format");
}

at::Device parse_device(const std::string& name, const char* what) {
  try {
    at::Device d(name);
    if (d.is_cpu() || d.is_cuda()) return d;
  } catch (const c10::Error&) {
  }
  throw Error(std::string(what) + " '" + name + "': expected \"cpu\" or \"cuda\" (or \"cuda:N\")");
}

// convnets.data.Loader's engine: a data::Loader from the pipeline options,
// iterated from Python. Waits for batches with the GIL released, in short
// slices, so that Ctrl-C in the interpreter stops the epoch at once.
class PyLoader {
 public:
  PyLoader(const std::string& source, const std::string& split, data::PipelineOptions o, std::int64_t max_images,
           const std::string& device, std::optional<bool> normalize, const std::string& dtype,
           const std::string& memory_format, std::optional<std::array<double, 3>> mean,
           std::optional<std::array<double, 3>> std)
      : device_(parse_device(device, "device")),
        dtype_(parse_dtype(dtype)),
        format_(parse_memory_format(memory_format)),
        normalize_(normalize.value_or(device_.is_cuda())),
        remode_(o.remode) {
    if (split != "train" && split != "val") throw Error("split '" + split + "': expected \"train\" or \"val\"");
    if (max_images < 0) throw Error("max_images must be 0 (all) or positive, got " + std::to_string(max_images));
    const Preprocessing imagenet;
    mean_ = mean.value_or(imagenet.mean);
    std_ = std.value_or(imagenet.std);
    for (double s : std_) {
      if (!(s > 0)) throw Error("std values must be positive");
    }
    if (o.reprob > 0 && !normalize_) {
      throw Error("reprob: random erasing fills normalised pixels (timm's RandomErasing); ask for normalize=True "
                  "or a CUDA device");
    }
    o.mean = mean_;
    o.warn = [this](const std::string& line) {
      std::lock_guard<std::mutex> lock(warn_mutex_);
      warnings_.push_back(line);
    };
    (void)data::transform_options(o);  // the options' errors before the files'
    dataset_ = data::head(data::open_dataset(source, split), static_cast<std::size_t>(max_images));
    loader_ = data::make_loader(dataset_, o);
  }

  std::int64_t len() const { return live().batches_per_epoch(); }

  void set_epoch(std::int64_t epoch) {
    if (epoch < 0) throw Error("set_epoch: the epoch must be 0 or more, got " + std::to_string(epoch));
    next_epoch_ = epoch;
    epoch_set_ = true;
  }

  // A pass over the data starts the epoch set_epoch() gave, else the one
  // after the previous pass (the first is epoch 0).
  PyLoader& iter() {
    auto& l = live();
    const std::int64_t epoch = epoch_set_ ? next_epoch_ : started_ ? current_ + 1 : 0;
    {
      py::gil_scoped_release nogil;
      l.start_epoch(epoch);
    }
    current_ = epoch;
    started_ = true;
    epoch_set_ = false;
    return *this;
  }

  py::tuple next() {
    auto& l = live();
    if (!l.active()) throw py::stop_iteration();
    data::Batch b;
    try {
      for (;;) {
        data::Loader::Wait w;
        {
          py::gil_scoped_release nogil;
          w = l.next_for(b, std::chrono::milliseconds(50));
        }
        emit_warnings();
        if (w == data::Loader::Wait::Batch) break;
        if (w == data::Loader::Wait::End) {
          l.stop();
          throw py::stop_iteration();
        }
        if (PyErr_CheckSignals() != 0) throw py::error_already_set();  // KeyboardInterrupt, usually
      }
    } catch (const py::stop_iteration&) {
      throw;
    } catch (...) {
      l.stop();  // the workers stop building batches nobody will take
      throw;
    }
    at::Tensor images = b.images, labels = b.labels;
    if (normalize_ || !device_.is_cpu()) {
      py::gil_scoped_release nogil;
      if (normalize_) {
        images = data::normalize_batch(images, mean_, std_, device_, dtype_, format_);
        if (b.erase.defined()) images = data::apply_random_erasing(images, b.erase, remode_);
      } else {
        images = images.to(device_, /*non_blocking=*/true);
      }
      labels = labels.to(device_, /*non_blocking=*/true);
    }
    return py::make_tuple(images, labels);
  }

  // Ends the pass now and joins the threads; the loader cannot be used again.
  void close() {
    std::unique_ptr<data::Loader> l = std::move(loader_);
    py::gil_scoped_release nogil;
    l.reset();
  }
  bool closed() const { return !loader_; }

  py::dict stats() const {
    const auto s = live().stats();
    py::dict d;
    d["epoch"] = current_;
    d["images"] = s.images;
    d["bad_images"] = s.bad_images;
    d["read_s"] = s.read_s;
    d["decode_s"] = s.decode_s;
    d["transform_s"] = s.transform_s;
    return d;
  }

  std::vector<std::string> bad_files() const { return live().bad_files(); }
  const std::vector<std::string>& classes() const { return dataset_->classes(); }
  const std::string& description() const { return dataset_->description(); }
  std::int64_t samples_per_epoch() const { return live().samples_per_epoch(); }
  int workers() const { return live().workers(); }
  int channels() const { return dataset_->channels(); }
  std::int64_t epoch() const { return started_ ? current_ : -1; }

 private:
  data::Loader& live() const {
    if (!loader_) throw Error("the loader is closed");
    return *loader_;
  }

  // Bad-image reports reach Python's warnings on the interpreter's thread.
  void emit_warnings() {
    std::vector<std::string> lines;
    {
      std::lock_guard<std::mutex> lock(warn_mutex_);
      lines.swap(warnings_);
    }
    for (const auto& line : lines) {
      if (PyErr_WarnEx(g_bad_image_warning, line.c_str(), 1) != 0) throw py::error_already_set();
    }
  }

  at::Device device_;
  at::ScalarType dtype_;
  at::MemoryFormat format_;
  bool normalize_;
  std::string remode_;
  std::array<double, 3> mean_{}, std_{};
  data::DatasetPtr dataset_;
  std::unique_ptr<data::Loader> loader_;
  std::int64_t next_epoch_ = 0, current_ = 0;
  bool epoch_set_ = false, started_ = false;
  std::mutex warn_mutex_;
  std::vector<std::string> warnings_;
};

class PyModel {
 public:
  PyModel(const std::string& checkpoint, const deploy::InferenceOptions& o) {
    py::gil_scoped_release nogil;
    model_ = std::make_unique<deploy::InferenceModel>(checkpoint, o);
  }

  at::Tensor call(const at::Tensor& batch) const {
    py::gil_scoped_release nogil;
    return model_->logits(batch);
  }

  py::object predict(const std::vector<std::string>& paths, std::int64_t top_k, std::int64_t batch_size,
                     std::int64_t max_image_pixels) const {
    if (paths.empty()) throw Error("predict: no image paths given");
    nlohmann::ordered_json doc;
    {
      py::gil_scoped_release nogil;
      doc = model_->to_json(model_->classify(paths, top_k, batch_size, max_image_pixels));
    }
    return to_python(doc.at("results"));
  }

  const deploy::InferenceModel& model() const { return *model_; }

 private:
  std::unique_ptr<deploy::InferenceModel> model_;
};

}  // namespace
}  // namespace convnets::python

PYBIND11_MODULE(_convnets, m) {
  using namespace convnets;
  using namespace convnets::python;
  m.doc() = "convnets' C++ library: the loader, inference and export (use the convnets package, not this module)";
  m.attr("__version__") = CONVNETS_VERSION;
  m.attr("default_max_image_pixels") = codec::kDefaultMaxImagePixels;
  // Errors name options as this front spells them: crop_padding, not --crop-padding.
  options::set_naming(options::Naming::Python);
  m.def(
      "choices",
      [] {
        std::map<std::string, std::vector<std::string>> out;
        for (const auto* c : options::all_choices()) out[c->id] = c->values;
        return out;
      },
      "The allowed values of each option that takes one of a list (core/options.h), by its declaration's name.");

  // The image errors are OSErrors, as PIL's are (UnidentifiedImageError,
  // "image file is truncated"); the pixel limit is PIL's DecompressionBombError.
  g_bad_image = PyErr_NewExceptionWithDoc(
      "convnets.BadImageError", "An image file that cannot be read or decoded (with bad_images=\"fail\").",
      PyExc_OSError, nullptr);
  g_image_too_large = PyErr_NewExceptionWithDoc(
      "convnets.ImageTooLargeError",
      "An image whose header asks for more pixels than max_image_pixels allows (PIL's decompression-bomb rule).",
      g_bad_image, nullptr);
  g_bad_image_warning = PyErr_NewExceptionWithDoc(
      "convnets.BadImageWarning", "A bad image skipped and replaced by the next good one (bad_images=\"skip\").",
      PyExc_UserWarning, nullptr);
  m.attr("BadImageError") = py::handle(g_bad_image);
  m.attr("ImageTooLargeError") = py::handle(g_image_too_large);
  m.attr("BadImageWarning") = py::handle(g_bad_image_warning);
  py::register_exception_translator(&translate);

  m.def("engine_versions", [] {
    const std::string openvino = deploy::openvino_version();
    return compat::engine_versions() + (openvino.empty() ? "" : ", OpenVINO " + openvino);
  }, "The LibTorch, CUDA, cuDNN (and OpenVINO) versions this build links.");
  m.def("engines", &deploy::engine_names, "The inference engines this build can run.");

  m.def(
      "environment_rank",
      [] {
        const auto r = distributed::resolve(distributed::LaunchOptions{});
        if (r.role == distributed::Role::Worker) return std::make_pair(r.worker.rank, r.worker.world_size);
        return std::make_pair(0, 1);
      },
      "(rank, world_size) from torchrun's (or Slurm's) environment, as `convnets train` reads it; (0, 1) outside one.");

  m.def(
      "models", [](std::int64_t num_classes) {
        ModelOptions mo;
        mo.num_classes = num_classes;
        py::list out;
        for (const auto& row : describe_architectures(mo)) out.append(to_python(row));
        return out;
      },
      py::arg("num_classes") = 1000, "Every arch as `convnets models --json` lists it.");

  m.def(
      "export",
      [](const deploy::ExportOptions& o) {
        py::gil_scoped_release nogil;
        return deploy::export_checkpoint(o);
      },
      py::arg("options"), "`convnets export` with these options; returns the line it prints.");

  py::class_<deploy::ExportOptions>(m, "ExportOptions")
      .def(py::init<>())
      .def_readwrite("checkpoint", &deploy::ExportOptions::checkpoint)
      .def_readwrite("output", &deploy::ExportOptions::output)
      .def_readwrite("format", &deploy::ExportOptions::format)
      .def_readwrite("key_style", &deploy::ExportOptions::key_style)
      .def_readwrite("dtype", &deploy::ExportOptions::dtype)
      .def_readwrite("arch", &deploy::ExportOptions::arch)
      .def_readwrite("key_layout", &deploy::ExportOptions::key_layout)
      .def_readwrite("ema", &deploy::ExportOptions::ema)
      .def_readwrite("dynamic_batch", &deploy::ExportOptions::dynamic_batch)
      .def_readwrite("fold_bn", &deploy::ExportOptions::fold_bn)
      .def_readwrite("image_size", &deploy::ExportOptions::image_size)
      .def_readwrite("opset", &deploy::ExportOptions::opset)
      .def_readwrite("batch_size", &deploy::ExportOptions::batch_size)
      .def_readwrite("int8", &deploy::ExportOptions::int8)
      .def_readwrite("reduce_range", &deploy::ExportOptions::reduce_range)
      .def_readwrite("calibration", &deploy::ExportOptions::calibration)
      .def_readwrite("calibration_method", &deploy::ExportOptions::calibration_method)
      .def_readwrite("activations", &deploy::ExportOptions::activations)
      .def_readwrite("silu", &deploy::ExportOptions::silu)
      .def_readwrite("device", &deploy::ExportOptions::device)
      .def_readwrite("calibration_images", &deploy::ExportOptions::calibration_images)
      .def_readwrite("calibration_batch", &deploy::ExportOptions::calibration_batch)
      .def_readwrite("max_image_pixels", &deploy::ExportOptions::max_image_pixels)
      .def_readwrite("workers", &deploy::ExportOptions::workers)
      .def_readwrite("triton", &deploy::ExportOptions::triton);

  py::class_<deploy::DynamicBatching>(m, "DynamicBatching")
      .def(py::init<>())
      .def_readwrite("max_batch_size", &deploy::DynamicBatching::max_batch_size)
      .def_readwrite("preferred_batch_sizes", &deploy::DynamicBatching::preferred_batch_sizes)
      .def_readwrite("max_queue_delay_us", &deploy::DynamicBatching::max_queue_delay_us)
      .def_readwrite("instances", &deploy::DynamicBatching::instances)
      .def_readwrite("max_queue_size", &deploy::DynamicBatching::max_queue_size);

  py::class_<deploy::TritonSettings>(m, "TritonSettings")
      .def(py::init<>())
      .def_readwrite("name", &deploy::TritonSettings::name)
      .def_readwrite("batching", &deploy::TritonSettings::batching)
      .def_readwrite("instance_kind", &deploy::TritonSettings::instance_kind)
      .def_readwrite("backend", &deploy::TritonSettings::backend)
      .def_readwrite("accelerator", &deploy::TritonSettings::accelerator)
      .def_readwrite("trt_precision", &deploy::TritonSettings::trt_precision)
      .def_readwrite("preprocessing", &deploy::TritonSettings::preprocessing);

  py::class_<data::PipelineOptions>(m, "PipelineOptions")
      .def(py::init<>())
      .def_readwrite("train", &data::PipelineOptions::train)
      .def_readwrite("image_size", &data::PipelineOptions::image_size)
      .def_readwrite("batch_size", &data::PipelineOptions::batch_size)
      .def_readwrite("workers", &data::PipelineOptions::workers)
      .def_readwrite("prefetch", &data::PipelineOptions::prefetch)
      .def_readwrite("seed", &data::PipelineOptions::seed)
      .def_readwrite("drop_last", &data::PipelineOptions::drop_last)
      .def_readwrite("rank", &data::PipelineOptions::rank)
      .def_readwrite("world_size", &data::PipelineOptions::world_size)
      .def_readwrite("crop_scale_min", &data::PipelineOptions::crop_scale_min)
      .def_readwrite("crop_padding", &data::PipelineOptions::crop_padding)
      .def_readwrite("flip", &data::PipelineOptions::flip)
      .def_readwrite("interpolation", &data::PipelineOptions::interpolation)
      .def_readwrite("augment", &data::PipelineOptions::augment)
      .def_readwrite("reprob", &data::PipelineOptions::reprob)
      .def_readwrite("recount", &data::PipelineOptions::recount)
      .def_readwrite("remode", &data::PipelineOptions::remode)
      .def_readwrite("crop_ratio", &data::PipelineOptions::crop_ratio)
      .def_readwrite("dct_scaling", &data::PipelineOptions::dct_scaling)
      .def_readwrite("bad_images", &data::PipelineOptions::bad_images)
      .def_readwrite("max_image_pixels", &data::PipelineOptions::max_image_pixels);

  py::class_<PyLoader>(m, "_Loader")
      .def(py::init<const std::string&, const std::string&, data::PipelineOptions, std::int64_t, const std::string&,
                    std::optional<bool>, const std::string&, const std::string&, std::optional<std::array<double, 3>>,
                    std::optional<std::array<double, 3>>>(),
           py::arg("source"), py::arg("split"), py::arg("options"), py::arg("max_images"), py::arg("device"),
           py::arg("normalize"), py::arg("dtype"), py::arg("memory_format"), py::arg("mean"), py::arg("std"))
      .def("__len__", &PyLoader::len, "Batches per epoch (of this rank).")
      .def("__iter__", &PyLoader::iter, py::return_value_policy::reference_internal,
           "Starts a pass: the epoch set_epoch() gave, else the one after the previous pass (0 first).")
      .def("__next__", &PyLoader::next, "The next (images, labels) of the pass.")
      .def("set_epoch", &PyLoader::set_epoch, py::arg("epoch"),
           "The epoch of the next pass (torch.utils.data.DistributedSampler's convention): its shuffle and "
           "augmentation.")
      .def("close", &PyLoader::close, "Stops the workers and joins them; the loader cannot be iterated again.")
      .def_property_readonly("closed", &PyLoader::closed, "Whether close() was called.")
      .def_property_readonly("epoch", &PyLoader::epoch, "The epoch of the current (or last) pass; -1 before the first.")
      .def_property_readonly("stats", &PyLoader::stats,
                             "The current (or last) pass so far: epoch, images, bad_images (replaced samples), and "
                             "read_s, decode_s, transform_s (seconds summed over the workers).")
      .def_property_readonly("bad_files", &PyLoader::bad_files, "Every distinct file skipped as bad so far.")
      .def_property_readonly("classes", &PyLoader::classes, "The class names, in label order.")
      .def_property_readonly("dataset", &PyLoader::description, "What the source is: kind, location, samples, classes.")
      .def_property_readonly("num_samples", &PyLoader::samples_per_epoch, "Samples per epoch (of this rank).")
      .def_property_readonly("workers", &PyLoader::workers, "Decoding threads.")
      .def_property_readonly("channels", &PyLoader::channels,
                             "Channels of the uint8 images: 3, or 1 for grayscale IDX data (normalised output has 3).");

  py::class_<deploy::InferenceOptions>(m, "InferenceOptions")
      .def(py::init<>())
      .def_readwrite("ema", &deploy::InferenceOptions::ema)
      .def_readwrite("device", &deploy::InferenceOptions::device)
      .def_readwrite("precision", &deploy::InferenceOptions::precision)
      .def_readwrite("memory_format", &deploy::InferenceOptions::memory_format)
      .def_readwrite("fold_bn", &deploy::InferenceOptions::fold_bn)
      .def_readwrite("engine", &deploy::InferenceOptions::engine)
      .def_readwrite("image_size", &deploy::InferenceOptions::image_size)
      .def_readwrite("as_float", &deploy::InferenceOptions::as_float)
      .def_readwrite("arch", &deploy::InferenceOptions::arch)
      .def_readwrite("key_layout", &deploy::InferenceOptions::key_layout)
      .def_readwrite("cuda_graph", &deploy::InferenceOptions::cuda_graph)
      .def_readwrite("graph_batch_sizes", &deploy::InferenceOptions::graph_batch_sizes)
      .def_readwrite("graph_memory_mb", &deploy::InferenceOptions::graph_memory_mb)
      .def_readwrite("fused_conv", &deploy::InferenceOptions::fused_conv)
      .def_readwrite("num_classes", &deploy::InferenceOptions::num_classes);

  py::class_<PyModel>(m, "_Model")
      .def(py::init<const std::string&, const deploy::InferenceOptions&>(), py::arg("checkpoint"), py::arg("options"))
      .def("__call__", &PyModel::call, py::arg("images"))
      .def("predict", &PyModel::predict, py::arg("paths"), py::arg("top_k"), py::arg("batch_size"),
           py::arg("max_image_pixels"))
      .def_property_readonly("arch", [](const PyModel& p) { return p.model().arch().name; })
      .def_property_readonly("classes", [](const PyModel& p) { return p.model().class_names(); })
      .def_property_readonly("num_classes", [](const PyModel& p) { return p.model().num_classes(); })
      .def_property_readonly("checkpoint", [](const PyModel& p) { return p.model().checkpoint(); })
      .def_property_readonly("quantized", [](const PyModel& p) { return p.model().quantized(); })
      .def_property_readonly("weights", [](const PyModel& p) { return p.model().options().ema ? "ema" : "model"; })
      .def_property_readonly("device", [](const PyModel& p) { return p.model().runtime().device.str(); })
      .def_property_readonly("precision", [](const PyModel& p) { return p.model().runtime().precision; })
      .def_property_readonly("engine", [](const PyModel& p) { return p.model().engine_name(); })
      .def_property_readonly(
          "kernel_precisions", [](const PyModel& p) { return p.model().engine().kernel_precisions(); },
          "How many convolutions and fully connected layers run in each precision ('u8', 'i8', 'bf16', 'f32'), "
          "as the engine reports after compiling (OpenVINO); empty where the engine does not report it (torch).")
      .def_property_readonly("preprocessing",
                             [](const PyModel& p) { return to_python(to_json(p.model().preprocessing())); });
}
