#include "train/trainer.h"

#include "core/error.h"
#include "core/json.h"
#include "data/rng.h"
#include "io/atomic_file.h"
#include "report/report.h"
#include "runtime/evaluate.h"
#include "runtime/progress.h"
#include "train/graph_step.h"
#include "train/run.h"
#include "train/run_outputs.h"
#include "train/step.h"
#include "train/workspace.h"
#include "train/world_change.h"

#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <exception>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>

namespace convnets::train {
using runtime::EvalResult;
using runtime::Progress;
using runtime::batch_input;
using runtime::evaluate;
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

// ---- stopping: SIGINT/SIGTERM finish the step, save `last` and exit 128 + signal

std::atomic<int> g_signal{0};

extern "C" void on_signal(int sig) {
  g_signal.store(sig);
  // A second signal kills the process the default way.
  std::signal(sig, SIG_DFL);
}

// Installed for the run only, so a Ctrl-C during setup still exits at once.
class SignalScope {
 public:
  SignalScope() {
    g_signal.store(0);
    previous_int_ = std::signal(SIGINT, on_signal);
    previous_term_ = std::signal(SIGTERM, on_signal);
  }
  ~SignalScope() {
    std::signal(SIGINT, previous_int_);
    std::signal(SIGTERM, previous_term_);
  }

 private:
  void (*previous_int_)(int);
  void (*previous_term_)(int);
};

const char* signal_name(int sig) { return sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : "a signal"; }

// The signal to stop on, if any. A signal must stop every rank after the
// same step, or the collectives would go out of step: data-parallel runs
// agree on it at each log line (`agree`) and at epoch ends.
int pending_signal(const TrainingRun& run, bool agree) {
  const int sig = g_signal.load();
  if (!run.group) return sig;
  if (!agree) return 0;
  return run.group->any(sig != 0) ? (sig != 0 ? sig : SIGTERM) : 0;
}

// Called with `last` saved; the exit code and message say how to go on.
int interrupted(const TrainingRun& run, int sig, const std::string& where) {
  if (!run.writer) return 128 + sig;
  std::cerr << "convnets: interrupted by " << signal_name(sig) << " " << where;
  if (run.config.checkpoints) {
    std::cerr << "; saved " << run.last_path << "\n  resume with: " << run.options.command << " --resume "
              << run.last_path << '\n';
  } else {
    std::cerr << "; no checkpoint saved (--no-checkpoints), the run cannot resume\n";
  }
  return 128 + sig;
}

// ---- one epoch of training

// The images trained in a span of steps, and a digest of which: the sum of a mix of each one's dataset index
// (mod 2^64), so that an image trained twice or skipped across a resume or a world change shows in the log, not
// only a count.
struct StepImages {
  std::int64_t images = 0;
  std::uint64_t digest = 0;
  void add(const StepImages& o) {
    images += o.images;
    digest += o.digest;
  }
};

// Loss and time summed over a span of steps (a log window, or the epoch). The
// loss stays on the device until the span is reported: no sync per step.
struct StepTotals {
  at::Tensor loss;
  double data_s = 0, compute_s = 0;
  std::int64_t steps = 0;
  StepImages seen;

  explicit StepTotals(const c10::Device& device)
      : loss(torch::zeros({}, torch::dtype(torch::kDouble).device(device))) {}
  void add(const at::Tensor& step_loss, double data, double compute, const StepImages& step_images) {
    loss += step_loss;
    data_s += data;
    compute_s += compute;
    ++steps;
    seen.add(step_images);
  }
  // The images and their digest over every rank (a collective in data-parallel runs; unsigned sums wrap alike).
  StepImages global_images(const TrainingRun& run) const {
    if (!run.group) return seen;
    at::Tensor t = torch::tensor({seen.images, static_cast<std::int64_t>(seen.digest)}, torch::kLong);
    run.group->all_reduce_sum(t);
    return {t[0].item<std::int64_t>(), static_cast<std::uint64_t>(t[1].item<std::int64_t>())};
  }
  // The mean step loss over every rank (a collective in data-parallel runs).
  double mean_loss(const TrainingRun& run) {
    if (run.group) {
      run.group->all_reduce_sum(loss);
      loss /= run.world;
    }
    return loss.item<double>() / static_cast<double>(std::max<std::int64_t>(steps, 1));
  }
  void reset() {
    loss.zero_();
    data_s = compute_s = 0;
    steps = 0;
    seen = {};
  }
};

std::string hex(std::uint64_t v) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(v));
  return text;
}

// The log's count and digest of the images of a span of steps (StepTotals::global_images).
void log_images_seen(nlohmann::ordered_json& entry, const StepImages& seen) {
  entry["train.images"] = seen.images;
  entry["train.image_digest"] = hex(seen.digest);
}

struct EpochOutcome {
  nlohmann::ordered_json log;  // the epoch's DLLogger entry, validation to be added
  bool complete = false;       // every step of the epoch ran
  bool prof_reached = false;   // --prof's step count is done: the run ends after this epoch
  int interrupted_by = 0;      // a signal that stopped it mid-epoch (`last` saved)
};

// The step's micro-batches from the loader, on the device.
std::vector<MicroBatch> next_step_batches(TrainingRun& run, data::Batch& batch, StepImages& seen) {
  std::vector<MicroBatch> micro;
  for (std::int64_t m = 0; m < run.micro_per_step; ++m) {
    if (!run.train_loader->next(batch)) throw Error("loader: the epoch ended early");  // not reachable: sizes checked
    for (const auto index : batch.indices) seen.digest += data::Rng::mix(static_cast<std::uint64_t>(index));
    seen.images += static_cast<std::int64_t>(batch.indices.size());
    micro.push_back({batch_input(batch, run.pre, run.rt), batch.labels.to(run.rt.device, /*non_blocking=*/true),
                     batch.erase});
  }
  return micro;
}

// The log entry of the steps `totals` counts, over `wall_s` seconds: their mean loss (summed over the ranks, so
// every rank asks), speed, the LR they ended at and the images they trained.
nlohmann::ordered_json train_entry(TrainingRun& run, StepTotals& totals, double wall_s, double lr) {
  const double steps = static_cast<double>(totals.steps);
  const double images = steps * static_cast<double>(run.optimizer_batch);
  nlohmann::ordered_json entry{{"train.loss", totals.mean_loss(run)},
                               {"train.total_ips", images / wall_s},
                               {"train.compute_ips", images / totals.compute_s},
                               {"train.data_time", totals.data_s / steps},
                               {"train.compute_time", totals.compute_s / steps},
                               {"train.lr", lr}};
  if (run.scaler) entry["train.loss_scale"] = run.scaler->value();
  log_images_seen(entry, totals.global_images(run));
  return entry;
}

// A log line every --print-freq steps: the window's mean loss and speed.
void log_window(TrainingRun& run, StepTotals& window, Progress& progress, std::int64_t epoch, std::int64_t done,
                double lr) {
  const auto entry = train_entry(run, window, window.data_s + window.compute_s, lr);
  const double loss = entry.at("train.loss").get<double>();
  log_metrics(run, {epoch + 1, done}, entry);
  window.reset();
  if (run.writer) {
    progress.update(done, entry.at("train.total_ips").get<double>(), "loss " + fmt("%.4f", loss) + "  lr " + fmt("%.4g", lr));
  }
}

EpochOutcome train_one_epoch(TrainingRun& run, StepRunner& stepper, std::int64_t epoch) {
  const auto& c = run.config;
  auto& pos = run.position;
  const std::int64_t first = pos.step_in_epoch;
  const std::int64_t last_step = c.prof > 0 ? std::min(c.prof, run.schedule->total_steps()) : run.schedule->total_steps();
  const bool terminal = run.writer && Progress::stdout_is_terminal();
  run.train_loader->start_epoch(epoch, first * run.micro_per_step);
  Progress progress("epoch " + std::to_string(epoch + 1) + "/" + std::to_string(c.epochs) + " train",
                    run.steps_per_epoch, c.print_freq, terminal, first);
  StepTotals total(run.rt.device), window(run.rt.device);
  data::Batch batch;
  double lr = 0;
  EpochOutcome out;
  const auto epoch_start = Clock::now();
  for (std::int64_t s = first; s < run.steps_per_epoch; ++s) {
    const auto t0 = Clock::now();
    StepImages seen;
    const auto micro = next_step_batches(run, batch, seen);
    if (pos.global_step == 0) log_images(run, batch.images);
    const auto t1 = Clock::now();
    lr = run.schedule->at(pos.global_step);
    const at::Tensor step_loss = stepper.run(micro, lr, pos.global_step);
    ++pos.global_step;
    pos.step_in_epoch = s + 1;
    if (run.group) run.group->set_progress(pos.global_step);
    const auto t2 = Clock::now();
    total.add(step_loss, seconds_between(t0, t1), seconds_between(t1, t2), seen);
    window.add(step_loss, seconds_between(t0, t1), seconds_between(t1, t2), seen);
    const bool log_now = (s + 1) % c.print_freq == 0 || s + 1 == run.steps_per_epoch;
    if (log_now) {
      log_window(run, window, progress, epoch, s + 1, lr);
    } else if (terminal) {
      const double images = static_cast<double>(total.steps * run.optimizer_batch);
      progress.update(s + 1, images / seconds_between(epoch_start, Clock::now()), "lr " + fmt("%.4g", lr));
    }
    const int sig = pending_signal(run, log_now);
    if (sig != 0 && s + 1 < run.steps_per_epoch) {
      save_run(run, run.last_path);
      std::cout << '\n';
      out.interrupted_by = sig;
      return out;
    }
    if (c.prof > 0 && pos.global_step >= last_step) {
      out.prof_reached = true;
      break;
    }
    // Not at the epoch's end, whose own checkpoint follows at once.
    if (s + 1 < run.steps_per_epoch && checkpoint_due(run)) save_run_in_background(run);
  }
  out.complete = pos.step_in_epoch == run.steps_per_epoch;
  out.log = train_entry(run, total, seconds_between(epoch_start, Clock::now()), lr);
  out.log["train.bad_images"] = run.train_loader->stats().bad_images;
  if (run.writer) {
    progress.finish("loss " + fmt("%.4f", out.log["train.loss"].get<double>()) + "  " +
                    fmt("%.0f", out.log["train.total_ips"].get<double>()) + " img/s");
  }
  // The files skipped for the first time this epoch, by name, so the log says
  // which files to fix and not only how many there were.
  const auto bad = run.train_loader->bad_files();
  if (bad.size() > run.bad_files_logged) {
    out.log["train.bad_files"] = std::vector<std::string>(bad.begin() + static_cast<std::ptrdiff_t>(run.bad_files_logged), bad.end());
    run.bad_files_logged = bad.size();
  }
  return out;
}

// ---- validation: the model, and the EMA when there is one

// evaluate()'s hook that adds a data-parallel run's per-shard counts up (none alone).
std::function<void(at::Tensor&)> rank_sum(TrainingRun& run) {
  if (!run.group) return {};
  return [&run](at::Tensor& t) { run.group->all_reduce_sum(t); };
}

struct Validation {
  EvalResult model;
  std::optional<EvalResult> ema;
  // The result that picks the best checkpoint (--best-by).
  const EvalResult& deciding(const TrainingRun& run) const { return best_by_ema(run) ? *ema : model; }
};

Validation validate_epoch(TrainingRun& run, std::int64_t epoch, nlohmann::ordered_json& entry) {
  const auto& c = run.config;
  const auto sum_over_ranks = rank_sum(run);
  const std::string tag = "epoch " + std::to_string(epoch + 1) + "/" + std::to_string(c.epochs);
  Validation v;
  v.model = evaluate(*run.model, *run.val_loader, run.rt, run.pre, c.top_k, run.writer ? tag + " val" : "",
                     c.print_freq, sum_over_ranks);
  entry.update(v.model.to_dllogger("val"));
  if (run.ema) {
    v.ema = evaluate(*run.ema->model(), *run.val_loader, run.rt, run.pre, c.top_k,
                     run.writer ? tag + " val (EMA)" : "", c.print_freq, sum_over_ranks);
    entry.update(v.ema->to_dllogger("val_ema"));
  }
  return v;
}

// ---- end of an epoch: log, `last`, `best`, `epoch-N` and their pruning (train/workspace.h)

// `last` always; `best` when validation improved on a whole epoch; every
// --save-every epochs a kept copy, the oldest beyond --keep removed.
void save_epoch_checkpoints(TrainingRun& run, std::int64_t epoch, bool complete, bool improved) {
  const auto& c = run.config;
  save_run(run, run.last_path);
  if (!run.writer || !complete || !c.checkpoints) return;
  if (improved) copy_file_atomically(run.last_path, (fs::path(c.workspace) / "best.safetensors").string());
  if (c.save_every > 0 && (epoch + 1) % c.save_every == 0) {
    copy_file_atomically(run.last_path,
                         (fs::path(c.workspace) / ("epoch-" + std::to_string(epoch + 1) + ".safetensors")).string());
    prune_epoch_checkpoints(c.workspace, c.keep);
  }
}

// The run's summary line in the log and on stdout (rank 0).
int finish_run(TrainingRun& run, const std::optional<Validation>& last_val) {
  const auto& pos = run.position;
  const bool by_ema = best_by_ema(run);
  nlohmann::ordered_json summary{{"train.steps", pos.global_step}};
  if (run.stopped_early) summary["train.early_stopped_at_epoch"] = pos.epoch;
  if (pos.best_epoch > 0) {
    summary["val.best_top1"] = pos.best_top1;  // of the model or the EMA, as val.best_by says
    summary["val.best_epoch"] = pos.best_epoch;
    summary["val.best_by"] = by_ema ? "ema" : "model";
  }
  if (last_val) {
    summary.update(last_val->model.to_dllogger("val"));
    if (last_val->ema) summary.update(last_val->ema->to_dllogger("val_ema"));
  }
  if (!run.writer) return 0;
  run.log->log(nlohmann::json::array(), summary);
  std::cout << "done: " << pos.global_step << " steps";
  if (pos.best_epoch > 0) {
    std::cout << ", best " << (by_ema ? "EMA " : "") << "top-1 " << fmt("%.2f", pos.best_top1) << "% (epoch "
              << pos.best_epoch << ")";
  }
  if (run.config.checkpoints) std::cout << "; checkpoints in " << run.config.workspace;
  std::cout << '\n';
  if (run.stopped_early) {
    const std::int64_t patience = run.config.early_stopping_patience;
    std::cout << "early stopping: top-1 has not improved for " << patience << (patience == 1 ? " epoch (" : " epochs (")
              << (pos.best_epoch > 0 ? "best at epoch " + std::to_string(pos.best_epoch)
                                     : "best " + fmt("%.2f", pos.best_top1) + "% before this run")
              << "; --early-stopping-patience " << patience << "), stopped at epoch "
              << pos.epoch << "/" << run.config.epochs << '\n';
  } else if (pos.epoch < run.config.epochs && run.config.prof <= 0 && run.config.checkpoints) {
    std::cout << "stopped after --run-epochs " << run.config.run_epochs << " at epoch " << pos.epoch << "/"
              << run.config.epochs << "; continue with: " << run.options.command << " --resume " << run.last_path
              << '\n';
  }
  return 0;
}

// --test-teacher: the teacher's accuracy on the validation data before training
// (GPUNet's train.py prints it on rank 0; here every rank evaluates its shard).
void test_teacher(TrainingRun& run) {
  const auto r = evaluate(*run.teacher, *run.teacher_val_loader, run.rt, run.teacher_pre, run.config.top_k,
                          run.writer ? "teacher val" : "", run.config.print_freq, rank_sum(run));
  if (!run.writer) return;
  std::cout << "teacher " << run.config.teacher << " at " << run.teacher_pre.input_size << " px: top-1 "
            << fmt("%.2f", r.top1) << "%, top-" << r.k << " " << fmt("%.2f", r.topk) << "%, loss "
            << fmt("%.4f", r.loss) << '\n';
}

// --evaluate: validate the weights and print the figures. No checkpoint is
// written; with --raport-file given (DLE's benchmark line), the DLLogger file
// DLE's benchmark reads (WORKSPACE/--raport-file: the configuration, the
// epoch's figures and the summary), rewritten by the next evaluation but
// never written over a training run's log.
int evaluate_only(TrainingRun& run) {
  nlohmann::ordered_json entry;
  const std::int64_t epoch = run.position.epoch > 0 ? run.position.epoch - 1 : 0;
  std::unique_ptr<DlLogger> log;
  if (run.writer && run.options.evaluation_log) {
    const auto path = fs::path(run.config.workspace) / run.config.raport_file;
    if (fs::exists(path)) {
      bool evaluation = false;
      try {
        evaluation = report::parse_dllogger(path.string()).parameters.value("evaluate", false);
      } catch (const Error&) {
        // not a DLLogger file: not an evaluation's either
      }
      if (!evaluation) {
        throw Error("--evaluate: " + path.string() + " is the log of a training run",
                    "give --evaluate another --raport-file or --workspace");
      }
    }
    fs::create_directories(run.config.workspace);
    log = std::make_unique<DlLogger>(path.string(), /*append=*/false);
    log->log("PARAMETER", to_json(run.config));
  }
  (void)validate_epoch(run, epoch, entry);
  if (log) {
    log->log({epoch + 1}, entry);
    log->log(nlohmann::json::array(), entry);
  }
  if (run.writer) std::cout << dump_json(entry, 2) << '\n';
  return 0;
}

StepRunner make_stepper(TrainingRun& run) {
  const auto& c = run.config;
  StepOptions o;
  o.label_smoothing = c.label_smoothing;
  o.mix = {c.mixup, c.cutmix, c.mixup_prob, c.mixup_switch_prob};
  o.seed = static_cast<std::uint64_t>(c.seed);
  o.autocast = run.rt.autocast;
  o.sync = run.reducer.get();
  if (c.reprob > 0) o.erase_mode = c.remode;
  o.teacher = run.teacher.get();
  o.student_size = run.pre.input_size;
  o.random_layers = run.model->random_in_training();
  return StepRunner(*run.model, *run.optimizer, run.scaler.get(), run.ema.get(), o, run.rt.device, c.cuda_graph);
}

int train(const TrainConfig& config, const RunOptions& options, std::unique_ptr<distributed::Group>& group) {
  // A resumed run holds its log's lock from its first moment, not from
  // open_workspace: loading the data and the model can take minutes, during
  // which report --watch would otherwise see an unlocked log and call the run
  // stopped, and a second --resume would not be refused until then.
  // Taking the lock writes nothing.
  LogLock early_lock;
  std::exception_ptr lock_failure;
  const bool data_parallel = options.dist && options.dist->world_size > 1;
  if (options.resume && (!data_parallel || options.dist->rank == 0) && !config.evaluate) {
    try {
      early_lock = LogLock::take((fs::path(config.workspace) / config.raport_file).string(), /*create=*/false);
    } catch (const Error&) {
      if (!data_parallel) throw;
      lock_failure = std::current_exception();  // thrown once the group connects, so the other ranks hear why
    }
  }
  TrainingRun run = build_run(config, options, group);  // writes nothing; bad input throws here
  if (lock_failure) std::rethrow_exception(lock_failure);
  if (config.evaluate) return evaluate_only(run);
  plan_steps(run);
  open_workspace(run, std::move(early_lock));
  print_run_summary(run);
  if (run.teacher_val_loader) test_teacher(run);
  SignalScope signals;
  StepRunner stepper = make_stepper(run);
  std::optional<Validation> last_val;
  auto& pos = run.position;
  // The position says which epoch is next: the one after a whole epoch, the
  // same one after --prof stopped inside it. --run-epochs ends this
  // invocation early (a begun epoch counts); the schedule spans --epochs.
  const std::int64_t first_epoch = pos.epoch;
  const std::int64_t end_epoch =
      config.run_epochs > 0 ? std::min(config.epochs, pos.epoch + config.run_epochs) : config.epochs;
  for (std::int64_t epoch = pos.epoch; epoch < end_epoch; epoch = pos.epoch) {
    prune_when_due(run, epoch);
    EpochOutcome e = train_one_epoch(run, stepper, epoch);
    // The loader looks ahead into the next epoch; after this invocation's last, that would be decoding for nobody
    // while validation runs.
    if (epoch + 1 == end_epoch || e.prof_reached) run.train_loader->stop();
    if (e.interrupted_by != 0) {
      return interrupted(run, e.interrupted_by, "at epoch " + std::to_string(epoch + 1) + ", step " +
                                                    std::to_string(pos.step_in_epoch) + "/" +
                                                    std::to_string(run.steps_per_epoch));
    }
    bool improved = false;
    if (run.val_loader) {
      last_val = validate_epoch(run, epoch, e.log);
      const double top1 = last_val->deciding(run).top1;
      improved = top1 > pos.best_top1;
      if (improved) {
        pos.best_top1 = top1;
        pos.best_epoch = epoch + 1;
      }
    }
    log_metrics(run, {epoch + 1}, e.log);
    update_summary_csv(run, epoch + 1, e.log);
    if (e.complete) {
      pos.epoch = epoch + 1;
      pos.step_in_epoch = 0;
    }
    save_epoch_checkpoints(run, epoch, e.complete, improved);
    const int sig = pending_signal(run, /*agree=*/true);
    if (sig != 0 && epoch + 1 < end_epoch) return interrupted(run, sig, "after epoch " + std::to_string(epoch + 1));
    if (e.prof_reached) break;
    // DLE's early stopping, counted from the best epoch the position keeps, so that it holds across --resume; from
    // this invocation's first epoch where that is unknown (a DLE checkpoint keeps best_prec1, not its epoch), as
    // DLE's own counter starts at each launch.
    const std::int64_t patience = config.early_stopping_patience;
    const std::int64_t counted_from = pos.best_epoch > 0 ? pos.best_epoch : first_epoch;
    if (patience > 0 && e.complete && pos.epoch - counted_from >= patience && pos.epoch < config.epochs) {
      run.stopped_early = true;
      break;
    }
  }
  return finish_run(run, last_val);
}

}  // namespace

TrainConfig with_arch_defaults(TrainConfig config) {
  if (config.dropout < 0 || config.drop_path < 0) {
    const ArchInfo& arch = find_architecture(config.arch);
    if (config.dropout < 0) config.dropout = arch.dropout;
    if (config.drop_path < 0) config.drop_path = arch.drop_path;
  }
  return config;
}

int run_training(const TrainConfig& config, const RunOptions& options) {
  std::unique_ptr<distributed::Group> group;
  try {
    TrainConfig c = with_arch_defaults(config);
    if (options.resume && options.resume->is_training_checkpoint() && !options.optimizer_batch_given) {
      // Before anything is built from the batch: the loaders, the schedule, the position's conversion.
      const auto line = keep_images_per_step(c, options.resume->meta, options.dist ? options.dist->world_size : 1);
      if (!line.empty() && (!options.dist || options.dist->rank == 0)) std::cout << line << '\n';
    }
    return train(c, options, group);
  } catch (const distributed::DistributedError&) {
    throw;  // already the diagnosis; the failed rank published its own
  } catch (const std::exception& e) {
    // The other ranks name this one and its reason instead of a lost connection.
    if (group) group->publish_failure(e.what());
    throw;
  }
}

}  // namespace convnets::train
