// tessera/cli/commands.h — the subcommands of the `tessera` binary.
#pragma once

namespace tessera::cli {

int cmd_train(int argc, char** argv);
int cmd_generate(int argc, char** argv);
int cmd_translate(int argc, char** argv);  // cmd_translate.cpp
int cmd_prepare(int argc, char** argv);
int cmd_info(int argc, char** argv);
int cmd_make_task(int argc, char** argv);  // cmd_make_task.cpp
int cmd_eval(int argc, char** argv);       // cmd_eval.cpp
int cmd_bench(int argc, char** argv);
int cmd_tokenizer(int argc, char** argv);            // cmd_tokenizer.cpp
int cmd_bench_attention(int argc, char** argv);      // cmd_bench_attention.cpp
int cmd_bench_model(int argc, char** argv);          // cmd_bench_model.cpp
int cmd_bench_compare(int argc, char** argv);        // cmd_bench_compare.cpp
int tokenizer_train_command(int argc, char** argv);  // cmd_tokenizer_train.cpp: tessera tokenizer train

}  // namespace tessera::cli
