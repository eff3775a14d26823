// Training curves of kiln-gpt: a CSV row per evaluation (iteration, mean
// training loss since the previous row, validation loss, learning rate,
// seconds) and an SVG plot of both losses, written next to the model file.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace gpt {

struct Row {
  int64_t iter = 0;
  double train_loss = 0, val_loss = 0, lr = 0, seconds = 0;
};

// "out/gpt.gguf" -> "out/gpt.csv" (ext with its dot).
std::string sibling(const std::string& model_path, const std::string& ext);
std::vector<Row> read_csv(const std::string& path);  // empty when missing
// Both throw kiln::Error when the file cannot be written.
void write_csv(const std::string& path, const std::vector<Row>& rows);
void write_svg(const std::string& path, const std::vector<Row>& rows, const std::string& title);

}  // namespace gpt
