// Training curves of kiln-mnist: a per-epoch CSV and an SVG plot (loss and
// accuracy of the training and validation parts), written next to the model.
#pragma once
#include <string>
#include <vector>

namespace mnist {

struct EpochRow {
  int64_t epoch = 0;  // 1-based
  double train_loss = 0, train_loss_unc = 0, train_acc = 0, train_acc_unc = 0;
  double val_loss = 0, val_loss_unc = 0, val_acc = 0, val_acc_unc = 0;  // NaN without validation
  double seconds = 0;
};

// "model.gguf" -> "model.csv" / "model.svg" (same directory).
std::string sibling(const std::string& model_path, const std::string& ext);
// Rows of an existing CSV written by write_csv (empty when missing or unreadable).
std::vector<EpochRow> read_csv(const std::string& path);
// Both throw kiln::Error when the file cannot be written.
void write_csv(const std::string& path, const std::vector<EpochRow>& rows);
void write_svg(const std::string& path, const std::vector<EpochRow>& rows,
               const std::string& title);

}  // namespace mnist
