// The TensorBoard callback (declared in callbacks.hpp): its event files are format/'s.
#include <memory>
#include <stdexcept>

#include "troupe/format/event_file.hpp"
#include "troupe/nn/callbacks.hpp"
#include "troupe/nn/model.hpp"

namespace troupe::nn {

struct TensorBoard::Writers {
  std::unique_ptr<format::EventFileWriter> train;
  std::unique_ptr<format::EventFileWriter> validation;
  std::string directory;
};

TensorBoard::TensorBoard(std::string log_dir, std::int64_t update_freq)
    : log_dir_(std::move(log_dir)), update_freq_(update_freq), writers_(std::make_unique<Writers>()) {
  if (log_dir_.empty()) throw std::invalid_argument("TensorBoard: log_dir is empty");
  if (update_freq < 0) {
    throw std::invalid_argument("TensorBoard: update_freq " + std::to_string(update_freq) +
                                " (expected 0 for every epoch, or a number of steps)");
  }
}

TensorBoard::~TensorBoard() = default;

void TensorBoard::on_train_begin(Logs&) {
  writers_->directory = params().worker == 0 ? log_dir_ : log_dir_ + "/worker_" + std::to_string(params().worker);
  writers_->train = std::make_unique<format::EventFileWriter>(writers_->directory + "/train");
  writers_->validation.reset();
}

void TensorBoard::on_train_batch_end(std::int64_t, Logs& logs) {
  const std::int64_t step = model().control().step();
  if (update_freq_ == 0 || step % update_freq_ != 0 || !writers_->train) return;
  for (const auto& [name, value] : logs) writers_->train->add_scalar(name, step, value);
  writers_->train->flush();
}

void TensorBoard::on_epoch_end(int epoch, Logs& logs) {
  if (!writers_->train) return;
  for (const auto& [name, value] : logs) {
    if (name.rfind("val_", 0) == 0) {
      if (!writers_->validation) {
        writers_->validation = std::make_unique<format::EventFileWriter>(writers_->directory + "/validation");
      }
      writers_->validation->add_scalar("epoch_" + name.substr(4), epoch, value);
    } else {
      writers_->train->add_scalar("epoch_" + name, epoch, value);
    }
  }
  writers_->train->flush();
  if (writers_->validation) writers_->validation->flush();
}

void TensorBoard::on_train_end(Logs&) {
  if (writers_->train) writers_->train->flush();
  if (writers_->validation) writers_->validation->flush();
}

void TensorBoard::add_text(const std::string& tag, std::int64_t step, const std::string& text) {
  if (tag.empty()) throw std::invalid_argument("TensorBoard::add_text: the tag is empty");
  if (!writers_->train) {
    throw std::logic_error("TensorBoard::add_text(" + tag +
                           "): fit has not begun (the event file opens in on_train_begin)");
  }
  writers_->train->add_text(tag, step, text);
  writers_->train->flush();
}

std::vector<std::string> TensorBoard::files() const {
  std::vector<std::string> out;
  if (writers_->train) out.push_back(writers_->train->path());
  if (writers_->validation) out.push_back(writers_->validation->path());
  return out;
}

}  // namespace troupe::nn
