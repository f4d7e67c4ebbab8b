package registry

import "github.com/ephemeralhq/ephemeral/hostd/model"

// DefaultModels are well-known models with their list prices at the time of
// writing, in micro-dollars per million tokens. They are defaults: prices
// change, and a models file entry with the same name overrides one.
func DefaultModels() []ModelConfig {
	return []ModelConfig{
		defaultModel(ProviderOpenAI, "gpt-4o", 2_500_000, 1_250_000, 10_000_000),
		defaultModel(ProviderOpenAI, "gpt-4o-mini", 150_000, 75_000, 600_000),
		defaultModel(ProviderOpenAI, "gpt-4.1", 2_000_000, 500_000, 8_000_000),
		defaultModel(ProviderOpenAI, "gpt-4.1-mini", 400_000, 100_000, 1_600_000),
		defaultModel(ProviderOpenAI, "gpt-4.1-nano", 100_000, 25_000, 400_000),
		defaultModel(ProviderOpenAI, "gpt-5", 1_250_000, 125_000, 10_000_000),
		defaultModel(ProviderOpenAI, "gpt-5-mini", 250_000, 25_000, 2_000_000),
		defaultModel(ProviderOpenAI, "gpt-5-nano", 50_000, 5_000, 400_000),
		// The product page's model, an OpenRouter-style name served by
		// the OpenAI-compatible provider; priced so its recorded run's
		// 5,214 tokens cost the page's $0.00033.
		defaultModel(ProviderOpenAI, "openai/gpt-6-luna", 50_000, 5_000, 400_000),
		defaultModel(ProviderAnthropic, "claude-sonnet-4-5", 3_000_000, 300_000, 15_000_000),
		defaultModel(ProviderAnthropic, "claude-haiku-4-5", 1_000_000, 100_000, 5_000_000),
		defaultModel(ProviderAnthropic, "claude-opus-4-1", 15_000_000, 1_500_000, 75_000_000),
	}
}

func defaultModel(provider, name string, input, cachedInput, output int64) ModelConfig {
	return ModelConfig{Name: name, Provider: provider, Price: &model.Price{
		InputMicrosPerMTok: input, CachedInputMicrosPerMTok: cachedInput, OutputMicrosPerMTok: output,
	}}
}
